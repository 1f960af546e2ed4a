"""Loading a checkpoint costs its bytes in resident memory, not twice them (safetensors' own reader maps the file,
and every page it touches counts in the process until the map closes); a truncated or malformed shard is one line
naming the file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from freetoken.models.shard import Shard, ShardError

CHILD = """
import resource, sys
from freetoken.engine.slots import ExpertStore
from freetoken.models.checkpoint import load_checkpoint
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ckpt = load_checkpoint(sys.argv[1])
store = ExpertStore.from_checkpoint(ckpt)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.slow
def test_loading_costs_the_checkpoint_once(tmp_path):
    from tests.engine.conftest import build_checkpoint

    path = build_checkpoint("qwen3_moe", tmp_path / "m", hidden_size=256, moe_intermediate_size=256, num_experts=64,
                            num_hidden_layers=4)
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    assert size > 150 << 20  # big enough that doubling it stands out from the interpreter's own growth
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True)
    grown = int(done.stdout.strip().splitlines()[-1])
    assert grown < 1.2 * size, (grown, size)


def test_bad_shards_name_the_problem(tmp_path):
    good = tmp_path / "good.safetensors"
    save_file({"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, 4, dtype=torch.bfloat16)}, str(good))
    shard = Shard(good)
    assert torch.equal(shard.read("a"), torch.arange(10, dtype=torch.float32)) and shard.shape("b") == (3, 4)
    data = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    with pytest.raises(ShardError, match="tensor 'b': 24 bytes of BF16 \\[3, 4\\] do not match"):
        Shard(tmp_path / "cut.safetensors")
    (tmp_path / "header.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(ShardError, match="header length 1000000000 does not fit"):
        Shard(tmp_path / "header.safetensors")
    n = len(b'{"a": 1}')
    (tmp_path / "entry.safetensors").write_bytes(n.to_bytes(8, "little") + b'{"a": 1}')
    with pytest.raises(ShardError, match="tensor 'a': bad header entry 1"):
        Shard(tmp_path / "entry.safetensors")
    assert json  # the header is JSON: the messages above name each field
