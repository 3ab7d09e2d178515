"""Stands in for vLLM's API server in the lifecycle tests (tests/test_vllm_server.py): the same module path
and arguments, an "engine core" child in its process group, `/health` and `/metrics` on the given loopback
port, and on SIGTERM it stops its child and exits, as vLLM does. The real server is tested in
tests/test_vllm_e2e.py.

FAKE_VLLM_MODE: ok (default); die (exits during start-up, leaving its child behind, as a crashed API
server may); hang (never answers /health); stubborn (ignores SIGTERM, as does its child).
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    key_set = bool(os.environ.get("VLLM_API_KEY"))
    print(f"fake vLLM: model {args.model}, mode {mode}, api key set: {key_set}", flush=True)

    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if mode == "stubborn" else ""
    child = subprocess.Popen([sys.executable, "-c", f"{ignore}import time; time.sleep(600)"])
    print(f"api server pid {os.getpid()}, engine core pid {child.pid}", flush=True)

    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:

        def _stop(signum, frame):
            child.terminate()
            child.wait()
            sys.exit(0)

        signal.signal(signal.SIGTERM, _stop)

    if mode == "die":
        print("RuntimeError: operator torchvision::nms does not exist", flush=True)
        sys.exit(1)
    if mode == "hang":
        while True:
            time.sleep(1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *a):
            pass

        def do_GET(self):
            if self.path == "/health":
                body = b""
            elif self.path == "/metrics":
                body = b'# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{model_name="m"} 7.0\n'
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    time.sleep(0.5)  # a start-up that takes a moment
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
