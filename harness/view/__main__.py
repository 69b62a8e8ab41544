"""`python -m harness.view RUN_DIR [--compare RUN_B] [--port N]`: see a run in the browser.

Serves the viewer for a finished or a running run (the page re-reads the run directory on every
request) on 127.0.0.1 and prints its URL. With `--compare RUN_B` the "before / after" view shows
the same task's rollouts of both runs side by side (e.g. eval before and eval after training).
`--screenshots DIR` opens every view in headless Chromium, saves one PNG per view and exits.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from harness.view import view_command
from harness.view.data import RunData
from harness.view.server import ViewServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.view",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a harness.train / harness.eval --output-dir")
    parser.add_argument("--compare", type=Path, default=None, metavar="RUN_B",
                        help="a second run dir: the same tasks' rollouts side by side")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: only this machine)")
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="model dir or tokenizer.json to decode token ids (default: the "
                             "run's model, checkpoint, or the tiny model built here)")
    parser.add_argument("--screenshots", type=Path, default=None, metavar="DIR",
                        help="save a PNG of each view to DIR with headless Chromium, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        run = RunData(args.run_dir, tokenizer=args.tokenizer)
        compare = RunData(args.compare, tokenizer=args.tokenizer) if args.compare else None
        server = ViewServer(run, compare, host=args.host, port=args.port)
    except (FileNotFoundError, OSError) as exc:
        print(f"cannot start the viewer: {exc}", file=sys.stderr)
        return 2
    for data in (run, compare):
        if data is not None and not data.looks_like_a_run():
            print(f"note: {data.dir} has no run files yet; the page fills in as the run writes "
                  "them", file=sys.stderr)
    if args.screenshots is not None:
        from harness.view.browser import screenshot_views

        with server:
            for path in screenshot_views(server.url, args.screenshots, run,
                                         compare=compare is not None):
                print(path)
        return 0
    print(f"harness viewer for {run.dir} at {server.url}  (Ctrl-C to stop; "
          f"reopen later with: {view_command(run.dir)})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
