"""Progress: the bar, the plain line, the summary, from counts with hand-computed rates."""
from __future__ import annotations

import asyncio
import io

from service.batch.progress import Progress, ProgressCounts, format_bar, format_duration, format_line, format_summary


def test_rates_and_eta():
    counts = ProgressCounts(num_total=400, num_done=120, num_failed=3, num_tokens=6000, elapsed_s=30.0)
    assert counts.answers_per_s == 4.0 and counts.tokens_per_s == 200.0 and counts.eta_s == 70.0
    assert ProgressCounts(10, 0, 0, 0, 5.0).eta_s is None


def test_formats():
    counts = ProgressCounts(num_total=400, num_done=120, num_failed=3, num_tokens=6000, elapsed_s=30.0)
    assert format_bar(counts, width=10) == "[###-------] 120/400  30% | 4.0 answers/s | 200 tok/s | ETA 1m10s | 3 failed"
    assert format_line(counts) == "120/400 done (30%), 3 failed, 4.0 answers/s, 200 tokens/s, ETA 1m10s"
    done = ProgressCounts(400, 400, 3, 20000, 100.0, num_skipped=12)
    assert format_summary(done) == ("400 of 400 lines written (397 answered, 3 failed), 12 already in the output; "
                                    "20000 tokens in 1m40s (4.00 answers/s, 200.0 tokens/s)")
    assert [format_duration(s) for s in (None, 0.4, 59, 61, 3725)] == ["--", "0s", "59s", "1m01s", "1h02m"]


def test_a_terminal_gets_a_bar_redrawn_in_place_and_a_log_gets_lines():
    async def show(is_tty: bool) -> str:
        stream = io.StringIO()
        progress = Progress(stream, "batch", is_tty=is_tty, interval_s=0.0, tty_interval_s=0.0)
        progress.start(num_total=2, num_skipped=1)
        progress.line_written(failed=False, num_tokens=5)
        await asyncio.sleep(0.01)
        progress.line_written(failed=True, num_tokens=0)
        counts = await progress.finish()
        assert (counts.num_done, counts.num_failed, counts.num_tokens, counts.num_skipped) == (2, 1, 5, 1)
        return stream.getvalue()

    terminal = asyncio.run(show(True))
    assert "\rbatch: [" in terminal and "\x1b[K" in terminal and "2/2 100%" in terminal
    log = asyncio.run(show(False))
    assert "\r" not in log
    assert log.startswith("batch: 1 lines already in the output, 2 to run\nbatch: 1/2 done (50%), 0 failed")
    assert log.splitlines()[-1].startswith("batch: 2 of 2 lines written (1 answered, 1 failed), 1 already")
