"""A recording proxy between a real agent client and `ft serve`: every request's method, path, headers and JSON body
is written to a folder (one file per request, keys and home paths stripped), and the reply is passed through
unchanged (SSE streams chunk by chunk). How tests/clients/fixtures were made (benchmarks/agents.sh --capture).

    python tests/clients/capture.py --listen 18080 --upstream http://127.0.0.1:1919 --out DIR --name claude
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "proxy-authorization"}
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


def scrub(text: str, replacements: dict[str, str]) -> str:
    """Personal strings (home and work folders, keys) replaced by neutral ones, longest first; a path only where it
    stands as one (/root inside </root> is markup, not the home folder)."""
    for old in sorted(replacements, key=len, reverse=True):
        if old:
            text = re.sub(rf"(?<![<\w]){re.escape(old)}(?![\w])", replacements[old].replace("\\", r"\\"), text)
    return text


def make_handler(upstream: str, out: Path, name: str, replacements: dict[str, str], skip: tuple[str, ...] = ()):
    target = urlsplit(upstream)
    counter = iter(range(1, 10**6))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            record = {"method": self.command, "path": self.path,
                      "headers": {k.lower(): ("<redacted>" if k.lower() in SECRET_HEADERS else v)
                                  for k, v in headers.items()}}
            if body:
                try:
                    record["body"] = json.loads(body)
                except ValueError:
                    record["body_text"] = body.decode("utf-8", "replace")
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            record["status"] = resp.status
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_HEADERS:
                    self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            reply = b""
            while chunk := resp.read1(65536):
                reply += chunk
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            if resp.status >= 400:
                record["reply"] = reply.decode("utf-8", "replace")[:2000]
            conn.close()
            if any(self.headers.get("user-agent", "").startswith(s) for s in skip):
                return  # not the client's own request (ft launch probing the server)
            text = scrub(json.dumps(record, indent=1, ensure_ascii=False), replacements)
            with lock:  # numbered in the order the replies ended
                (out / f"{name}-{next(counter):03d}.json").write_text(text + "\n")

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", required=True, help="file prefix: the client's name")
    ap.add_argument("--skip-agent", action="append", default=[], metavar="PREFIX",
                    help="forward, but do not record, requests whose User-Agent starts with PREFIX")
    ap.add_argument("--scrub", action="append", default=[], metavar="OLD=NEW",
                    help="also replace OLD with NEW in what is written (repeatable)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    replacements = {os.path.expanduser("~"): "/home/user"}
    for pair in args.scrub:
        old, _, new = pair.partition("=")
        replacements[old] = new
    replacements.pop("", None)
    server = ThreadingHTTPServer(("127.0.0.1", args.listen), make_handler(args.upstream, args.out, args.name,
                                                                            replacements, tuple(args.skip_agent)))
    print(f"capturing on http://127.0.0.1:{server.server_address[1]} -> {args.upstream}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
