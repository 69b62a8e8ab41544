"""The run viewer in a real browser, on run directories a real run wrote during the test.

Run: .venv/bin/python -m pytest tests/test_view_browser.py -q -s

A real `harness.train` (1 step, one group of 2 rollouts of the bundled hello-file task) and a real
`harness.eval` (2 rollouts) run through the real capture proxy, bubblewrap sandboxes,
mini-swe-agent, the task's verifier and the trainer (the tiny model, one GRPO step); only the
engine is scripted (harness/audit/scripted_engine.py: vLLM's wire shape with the tiny model's real
tokenizer), so what the page must show does not depend on what a 2-layer model samples. In the
train run one rollout of the group solves the task and the other only talks (no tool call), so
the group has two rewards and a real advantage each; in the eval run both solve (the "after").

Then headless Chromium (Debian's package) opens `python -m harness.view TRAIN --compare EVAL`'s
server and checks what a person would see:

  * the run: the reward plot drawn (pixels of its series colour on the canvas), causes counted;
  * the rollouts: one row per recorded rollout, sortable by reward;
  * one rollout: the command the agent ran and the output it got back, the task's instruction,
    trained completion tokens decoded by the run's tokenizer (mask 1) and masked prompt tokens
    (mask 0), the verifier's reward and the advantage the trainer recorded;
  * before / after: the task's rollouts of both runs side by side;
  * the run's own held-out before/after: with the eval run's rollouts laid in the train run as its
    eval-before/ and eval-after/ and a before_after.json made from them (as harness.run.learning
    writes them; no more rollouts are run for it), the run page's table, the rollouts filtered
    to one side, and one eval rollout opened turn by turn.

Screenshots of every view are saved in the test's tmp dir (and under $HARNESS_VIEW_DOCS when set:
that is how docs/view-*.png were made).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.audit.scripted_engine import ScriptedEngine
from harness.eval import pass_rate_table
from harness.run.learning import before_after_table
from harness.view.browser import Browser, chromium_path
from harness.view.data import RunData
from harness.view.server import ViewServer
from tests.helpers.policies import TASK_DIR, GreetingPolicy

pytestmark = [pytest.mark.agents, pytest.mark.slow]

SERIES_RGB = (75, 123, 236)  # app.js LANES[0], the first series' stroke


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A train run (mixed group) and an eval run (both solve), through everything but vLLM.

    The model is the committed tiny model: the engine is scripted, so what its weights would
    sample does not matter, and the trainer still steps on them."""
    from harness.eval import run_eval
    from harness.shared.run_config import RunSettings
    from harness.train import run_training
    from launchers.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("view-runs")
    model = build_tiny_model()
    tasks = root / "tasks"
    shutil.copytree(TASK_DIR, tasks / "hello-file")
    common = {"harness": "mini-swe-agent", "model": str(model), "tasks": str(tasks),
              "max_tokens": 256, "max_agent_steps": 3, "agent_timeout_s": 180.0,
              "max_concurrent_rollouts": 2}
    quiet = Console(file=io.StringIO(), width=200)
    with ScriptedEngine(model, GreetingPolicy(talkers=True)) as engine:
        run_training(RunSettings(**common, engine_url=engine.url, weight_sync=False, steps=1,
                                 num_generations=2, output_dir=str(root / "train")), quiet)
        engine.script = GreetingPolicy(talkers=False)
        run_eval(RunSettings(**common, engine_url=engine.url, rollouts_per_task=2,
                             output_dir=str(root / "eval")), quiet)
        assert not engine.errors, engine.errors
    return {"train": root / "train", "eval": root / "eval"}


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def _series_pixels(plot_id: str) -> str:
    r, g, b = SERIES_RGB
    return f"""(() => {{
        const c = document.querySelector('#{plot_id} canvas');
        if (!c || !c.width) return -1;
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - {r}) < 30 && Math.abs(d[i + 1] - {g}) < 30
                && Math.abs(d[i + 2] - {b}) < 30 && d[i + 3] > 200) n++;
        return n;
    }})()"""


def test_the_viewer_shows_a_real_run_in_chromium(runs: dict[str, Path], tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.fail("Chromium is not installed: ./setup.sh installs Debian's chromium package "
                    "(apt-get install -y chromium)")
    train, after = runs["train"], runs["eval"]
    records = _records(train)
    trained = [json.loads(line) for line in (train / "trainer" / "groups.jsonl").read_text()
               .splitlines()]
    group0 = next(g for g in trained if g["group_index"] == 0)
    assert group0["skipped"] is None, group0  # one solved, one talked: two rewards
    by_episode = {r["episode_id"]: r for r in records}
    solver = next(by_episode[r["episode_id"]] for r in group0["rollouts"]
                  if by_episode[r["episode_id"]]["env_reward"] == 1.0)
    solver_advantage = next(r["advantage"] for r in group0["rollouts"]
                            if r["episode_id"] == solver["episode_id"])
    assert solver_advantage > 0
    shots = tmp_path / "screenshots"
    docs = os.environ.get("HARNESS_VIEW_DOCS")

    async def look(url: str) -> None:
        async with Browser() as browser:
            page = await browser.new_page(1400, 1000)

            async def shot(name: str) -> None:
                # uPlot paints on the next animation frame: wait for two to have run (a frame
                # that never comes is an error after 30 s, not a hang).
                await page.eval("new Promise((ok, no) => { setTimeout(() => no(new Error("
                                "'no animation frame in 30 s')), 30000); requestAnimationFrame("
                                "() => requestAnimationFrame(() => ok(true))); })")
                png = await page.screenshot(shots / f"view-{name}.png")
                assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
                if docs:
                    Path(docs).mkdir(parents=True, exist_ok=True)
                    (Path(docs) / f"view-{name}.png").write_bytes(png)

            # The run: a drawn reward plot, causes counted as the records say.
            await page.goto(url + "#/run")
            assert await page.eval("document.querySelector('#plot-reward').dataset.plot") == "drawn"
            await page.wait_for(f"{_series_pixels('plot-reward')} > 0",
                                what="the reward-per-step series drawn on its canvas")
            causes = await page.eval("document.querySelector('#causes').innerText")
            n_ok = sum(r["cause"] == "ok" for r in records)
            assert f"ok\t{n_ok}" in causes, causes
            await shot("run")

            # The rollouts: one row per record, sortable by reward.
            await page.goto(url + "#/rollouts")
            rows = await page.eval("document.querySelectorAll('#rollouts tbody tr').length")
            assert rows == len(records)
            await page.eval("document.querySelector('th[data-key=env_reward]').click()")
            first = await page.eval("document.querySelector('#rollouts tbody tr')"
                                    ".children[4].innerText")
            assert float(first) == max(r["env_reward"] or 0.0 for r in records)
            await shot("rollouts")

            # One rollout, as the agent lived it, token by token.
            await page.goto(url + f"#/rollout/{solver['index']}")
            text = await page.eval("document.querySelector('main').innerText")
            assert "printf 'Hello, Harness!\\n' > greeting.txt" in text  # its tool call
            assert "wrote-greeting" in text  # the tool result it got back from the sandbox
            assert "Create a file named `greeting.txt`" in text  # the task, as it was sent
            trained_text = await page.eval(
                "[...document.querySelectorAll('.turn:not(.aux) .completion .tok[data-mask=\"1\"]')]"
                ".map(s => s.textContent).join('')")
            assert "greeting.txt" in trained_text, trained_text[:500]  # decoded, not ids
            masked = await page.eval("document.querySelectorAll('.prompt .tok[data-mask=\"0\"]')"
                                     ".length")
            assert masked > 0
            assert await page.eval("document.querySelector('#env-reward').innerText") == "1"
            shown = await page.eval("document.querySelector('#advantage').innerText")
            assert float(shown) == pytest.approx(solver_advantage, abs=1e-4)
            await shot("rollout")

            # Before / after: the task's rollouts of both runs side by side.
            await page.goto(url + "#/compare")
            a_rows = await page.eval("document.querySelectorAll('#col-a tr.pick').length")
            b_rows = await page.eval("document.querySelectorAll('#col-b tr.pick').length")
            assert (a_rows, b_rows) == (len(records), len(_records(after)))
            await page.wait_for("document.querySelector('.conversation[data-run=\"b\"]')"
                                ".innerText.includes('greeting.txt')",
                                what="run B's first rollout conversation in its column")
            await shot("compare")

            # The run's own held-out before/after, and its eval rollouts by side.
            evaluated = _records(after)
            for side in ("eval-before", "eval-after"):
                shutil.copytree(after / "rollouts", train / side / "rollouts")
                shutil.copy(after / "rollouts.jsonl", train / side / "rollouts.jsonl")
            summary = pass_rate_table(evaluated)[1]
            _, written = before_after_table(summary, summary)
            (train / "before_after.json").write_text(json.dumps(written))
            await page.goto(url + "#/run")
            await page.wait_for("document.querySelector('#heldout-table') !== null",
                                what="the held-out before/after table on the run page")
            table = await page.eval("document.querySelector('#heldout-table').innerText")
            n, task = len(evaluated), evaluated[0]["task_id"]
            assert task in table and "overall" in table, table
            assert f"{n}/{n} (100%)" in table and "0.0 points" in table, table  # the same rollouts
            await shot("heldout")
            await page.goto(url + "#/rollouts?side=eval-after")
            sides = await page.eval("[...document.querySelectorAll('#rollouts tbody tr')]"
                                    ".map(tr => tr.dataset.side)")
            assert sides == ["eval-after"] * n, sides
            await page.eval("document.querySelector('#rollouts tbody tr a').click()")
            await page.wait_for("document.querySelector('#side') !== null && document"
                                ".querySelector('#side').innerText === 'eval-after'",
                                what="an eval-after rollout's page")
            text = await page.eval("document.querySelector('main').innerText")
            assert "printf 'Hello, Harness!\\n' > greeting.txt" in text  # its turns, read

    with ViewServer(RunData(train), RunData(after), port=0) as server:
        asyncio.run(look(server.url))
    print(f"screenshots: {sorted(str(p) for p in shots.glob('*.png'))}")
