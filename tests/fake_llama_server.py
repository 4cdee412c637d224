"""The llama-server stand-in (tests/fake_llamacpp.py) as a program taking llama-server's command line, for tests of
what starts llama-server itself (the bench's lanes, the runner): it serves on --port until SIGTERM, speculating
unless --spec-type is absent or none, and writes its arguments to its log (stdout) first; with
--spec-draft-n-max over 64 it exits at once, as a server that cannot start does."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_llamacpp  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--spec-type", default="none")
parser.add_argument("--spec-draft-n-max", type=int, default=16)
args, _ = parser.parse_known_args()
print("fake llama-server", " ".join(sys.argv[1:]), flush=True)
if args.spec_draft_n_max > 64:  # a configuration the stand-in refuses, as llama-server refuses some
    sys.exit("error: --spec-draft-n-max is too large")
app = fake_llamacpp.app(speculative=args.spec_type != "none")
uvicorn.run(app, host=args.host, port=args.port, log_level="error")
