"""lm-eval's `local-completions` against `ft serve`, batched (--batch_size 4), on an inline multiple-choice task: every
loglikelihood lm-eval computes from the server's replies must equal a direct HF transformers forward of the same
model on the same tokens. Not in CI: lm-eval (lm_eval on PyPI) pulls datasets, evaluate, scikit-learn, ...; point
--lm-eval at an environment that has it (e.g. `python -m venv V && V/bin/pip install 'lm_eval[api]'`).
tests/serve/test_loglikelihood.py checks the same wire format (batched token-id prompts, echo, logprobs,
max_tokens 1) without lm-eval.

    .venv/bin/python benchmarks/lm_eval_check.py --lm-eval /path/to/venv/bin/lm_eval
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = [  # question, choices, answer
    ("Where do the experts live?", ["in host memory", "on the moon", "in a slot"], 0),
    ("What holds a GPU slot?", ["an expert", "a token", "nothing"], 0),
    ("A miss is fetched or", ["computed on the CPU", "ignored", "cached twice"], 0),
    ("The placement policy decides", ["residency", "the weather", "the prompt"], 0),
    ("Prefill runs in", ["chunks", "circles", "reverse"], 0),
    ("Decode steps are", ["batched", "skipped", "random"], 0),
    ("The KV cache keeps", ["keys and values", "experts", "logs"], 0),
    ("The demo model is", ["tiny and random", "huge", "trained"], 0),
]
TASK = """task: freetoken_inline
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def serve(model_dir: Path | None):
    """ft serve in this process (a thread): -> (server, thread, service)."""
    from freetoken.serve.app import build_app
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.server import Server
    from freetoken.serve.startup import build_service, load

    cfg = ServeConfig(model=model_dir, port=0, device_budget_gb=1.0)
    backend, _ = load(cfg, log=lambda s: None)
    service = build_service(backend, cfg)
    server = Server(build_app(service, cfg), "127.0.0.1", 0, announce=False)
    return server, server.start_in_thread(), service


def hf_loglikelihood(model, tok, context: str, continuation: str) -> float:
    """log P(continuation | context) from one transformers forward, tokenized as lm-eval's _encode_pair does
    (trailing spaces of the context moved to the continuation, the pair encoded whole, then split)."""
    import torch

    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    cont = whole[len(ctx):]
    with torch.inference_mode():
        logits = model(torch.tensor([whole])).logits[0].float()  # [T, V]
    logprobs = torch.log_softmax(logits, -1)
    return float(sum(logprobs[len(ctx) - 1 + i, t] for i, t in enumerate(cont)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm-eval", default="lm_eval", help="the lm_eval executable")
    ap.add_argument("--model", type=Path, help="checkpoint directory (default: the shipped demo model)")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from freetoken.paths import DEMO_MODEL

    model_dir = args.model or DEMO_MODEL
    server, thread, service = serve(args.model)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            data = tmp / "docs.jsonl"
            data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in DOCS))
            (tmp / "task.yaml").write_text(TASK.format(data=data))
            cmd = [args.lm_eval, "run", "--model", "local-completions", "--model_args",
                   f"model={service.backend.model_id},base_url={server.url}/v1/completions,tokenizer={model_dir},"
                   f"tokenizer_backend=huggingface,num_concurrent=1,max_retries=1",
                   "--batch_size", "4", "--include_path", str(tmp), "--tasks", "freetoken_inline", "--log_samples",
                   "--output_path", str(tmp / "out")]
            run = subprocess.run(cmd, capture_output=True, text=True, env={"OPENAI_API_KEY": "unused",
                                                                              "PATH": "/usr/bin:/bin"})
            if run.returncode:
                print(run.stdout[-3000:], run.stderr[-3000:], file=sys.stderr)
                print(f"lm_eval exited {run.returncode}")
                return 1
            samples = [json.loads(line) for f in (tmp / "out").rglob("samples_*.jsonl")
                       for line in f.read_text().splitlines()]
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
        tok = AutoTokenizer.from_pretrained(model_dir)
        worst, n = 0.0, 0
        for s in samples:  # arguments {gen_args_i: {arg_0: context, arg_1: continuation}}, resps [[[ll, greedy]]]
            for args_i, resp in zip(s["arguments"].values(), s["resps"]):
                ref = hf_loglikelihood(model, tok, args_i["arg_0"], args_i["arg_1"])
                worst, n = max(worst, abs(float(resp[0][0]) - ref)), n + 1
        print(f"lm-eval local-completions --batch_size 4: {len(samples)} documents, {n} loglikelihoods; "
              f"max |lm-eval - transformers| = {worst:.2e} (tolerance {args.tolerance:g})")
        print(f"the server answered {service.counters.served} /v1/completions requests (4 prompts each, the last "
              f"maybe fewer)")
        return 0 if n and worst <= args.tolerance else 1
    finally:
        server.stop(thread)
        service.shutdown()


if __name__ == "__main__":
    sys.exit(main())
