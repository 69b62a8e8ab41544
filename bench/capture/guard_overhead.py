"""Per-request CPU of the capture proxy's HTTP layer (capture.guard: uvicorn's h11 behind a clock),
GET /health and a whole model call, the proxy (and its fake engine) in a process of its own so the
CPU counted is the server's. Not a test: it prints figures. Compare two trees:

    PYTHONPATH=<tree> .venv/bin/python bench/capture/guard_overhead.py
"""

import json
import os
import subprocess
import sys
import time

import httpx

SERVER = r'''
import sys, time
from capture import CaptureServer
from capture.fake_engine import FakeEngine
e = FakeEngine().start()
p = CaptureServer(e.url).start()
print(p.url, p.admin_key, flush=True)
time.sleep(3600)
'''

def cpu(pid):
    ticks = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/stat") as stat:
            f = stat.read().rsplit(")", 1)[1].split()
        ticks += int(f[11]) + int(f[12])
    return ticks / os.sysconf("SC_CLK_TCK")

proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
url, key = proc.stdout.readline().split()
try:
    with httpx.Client(timeout=30) as c:
        info = c.post(f"{url}/admin/sessions", headers={"authorization": f"Bearer {key}"}, json={}).json()
        out = {}
        for name, n, call in [
            ("health", 3000, lambda: c.get(f"{url}/health")),
            ("model_call", 600, lambda: c.post(f"{url}/s/{info['session_id']}/v1/chat/completions",
                headers={"authorization": f"Bearer {info['secret']}"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi " * 200}]})),
        ]:
            for _ in range(100):  # warm-up
                call()
            c0, t0 = cpu(proc.pid), time.perf_counter()
            for _ in range(n):
                assert call().status_code == 200
            c1, t1 = cpu(proc.pid), time.perf_counter()
            out[name] = {"server_cpu_us": round((c1 - c0) / n * 1e6), "wall_us": round((t1 - t0) / n * 1e6)}
        print(json.dumps(out))
finally:
    proc.kill()
