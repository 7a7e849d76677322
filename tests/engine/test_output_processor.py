"""OutputProcessor fed synthetic engine-core outputs carrying real tokenizer ids."""
from __future__ import annotations

import pytest

from engine.frontend.output_processor import OutputProcessor, RequestOutput
from engine.frontend.tokenizer import Tokenizer
from engine.protocol import EngineCoreOutput, FinishReason, RequestCounters, TokenLogprob
from engine.sampling_params import SamplingParams

EOS = 2
PROMPT = [1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198]


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
    return Tokenizer.from_model_dir(model_dir)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def processor(tok, clock) -> OutputProcessor:
    return OutputProcessor(tok, clock=clock)


def ids_of(tok: Tokenizer, *pieces: str) -> list[int]:
    return [i for piece in pieces for i in tok.encode(piece, add_special_tokens=False)]


def add(processor: OutputProcessor, request_id: str = "r", stream: bool = True, **params) -> None:
    processor.add_request(request_id, PROMPT, SamplingParams(**params), arrival_time=processor._clock(),
                          stream=stream)


def core_output(request_id: str, token_ids: list[int], finish_reason: FinishReason | None = None,
                **fields) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, list(token_ids),
                            finish_reason=None if finish_reason is None else int(finish_reason), **fields)


def run_steps(processor: OutputProcessor, request_id: str, steps: list[list[int]],
              last: dict | None = None) -> list[RequestOutput]:
    """Feed one core output per step; the last carries `last` (finish_reason and counters)."""
    results = []
    for i, token_ids in enumerate(steps):
        fields = last if (last is not None and i == len(steps) - 1) else {}
        outputs, to_abort = processor.process_outputs([core_output(request_id, token_ids, **fields)])
        assert to_abort == []
        results += outputs
    return results


def test_streaming_text_and_final_counters(processor, tok, clock):
    text = "Paris est la capitale de la France. 你好 🎉"
    token_ids = tok.encode(text, add_special_tokens=False) + [EOS]
    add(processor)
    steps = [token_ids[i:i + 2] for i in range(0, len(token_ids), 2)]
    clock.now += 0.5  # first token arrives 0.5 s after the request
    outputs = run_steps(processor, "r", steps[:1])
    clock.now += 1.0
    outputs += run_steps(processor, "r", steps[1:], last=dict(
        finish_reason=FinishReason.STOP, stop_reason=EOS, counters=RequestCounters(
            num_prompt_tokens=len(PROMPT), num_cached_tokens=4, num_forward_passes=12, num_forced_tokens=3,
            queued_s=0.1, grammar_wait_s=0.05), not_enforced=["minLength"]))

    assert len(outputs) == len(steps)  # one per step with tokens
    assert "".join(o.delta_text for o in outputs) == text
    assert [t for o in outputs for t in o.new_token_ids] == token_ids
    for o in outputs:
        assert o.text.endswith(o.delta_text) and text.startswith(o.text) and "\ufffd" not in o.text
        assert o.num_output_tokens == len(o.token_ids)
    assert [o.finished for o in outputs] == [False] * (len(steps) - 1) + [True]
    assert all(o.timings is None for o in outputs[:-1])

    final = outputs[-1]
    assert final.text == text and final.token_ids == token_ids  # eos kept in ids, not in text
    assert final.finish_reason is FinishReason.STOP and final.stop_reason == EOS
    counters = final.counters
    assert (final.num_prompt_tokens, counters.num_cached_tokens, final.num_output_tokens,
            counters.num_forward_passes, counters.num_forced_tokens) == (len(PROMPT), 4, len(token_ids), 12, 3)
    assert final.not_enforced == ["minLength"]
    assert final.timings.ttft_s == pytest.approx(0.5) and final.timings.total_s == pytest.approx(1.5)
    assert final.timings.queued_s == 0.1 and final.timings.grammar_wait_s == 0.05
    assert not processor.has_unfinished()


def test_stop_string_aborts_in_core_and_drops_later_tokens(processor, tok):
    add(processor, stop=["\n\n"], logprobs=0)
    first = ids_of(tok, "Answer:", " 42")
    second = ids_of(tok, ".", "\n\n", "Extra", " text")
    logprobs = [TokenLogprob(t, -0.5) for t in first + second]
    outputs, to_abort = processor.process_outputs(
        [core_output("r", first, new_logprobs=logprobs[:len(first)])])
    assert to_abort == [] and outputs[0].text == "Answer: 42"
    outputs, to_abort = processor.process_outputs(
        [core_output("r", second, new_logprobs=logprobs[len(first):])])

    assert to_abort == ["r"]  # the core never sees text: the caller must abort it there
    (final,) = outputs
    kept = first + ids_of(tok, ".", "\n\n")
    assert final.finished and final.finish_reason is FinishReason.STOP and final.stop_reason == "\n\n"
    assert final.text == "Answer: 42." and final.delta_text == "."
    assert final.token_ids == kept and final.new_token_ids == ids_of(tok, ".", "\n\n")
    assert final.num_output_tokens == len(kept)
    assert [lp.token_id for lp in final.logprobs] == kept
    assert [lp.token_id for lp in final.new_logprobs] == final.new_token_ids
    assert not processor.has_unfinished()
    # the core may still report tokens it produced before the abort reached it
    assert processor.process_outputs([core_output("r", ids_of(tok, "late"))]) == ([], [])
    assert processor.process_outputs([core_output("r", [], FinishReason.ABORT)]) == ([], [])


def test_stop_string_on_the_core_final_step_is_not_aborted(processor, tok):
    add(processor, stop=["END"], include_stop_str_in_output=True)
    outputs, to_abort = processor.process_outputs(
        [core_output("r", ids_of(tok, "a", "END", "b"), FinishReason.LENGTH)])
    assert to_abort == []  # the core already finished it
    assert outputs[0].finish_reason is FinishReason.STOP and outputs[0].stop_reason == "END"
    assert outputs[0].text == "aEND" and outputs[0].token_ids == ids_of(tok, "a", "END")


def test_held_back_stop_prefix_is_released_at_length(processor, tok):
    add(processor, stop=["###"])
    outputs = run_steps(processor, "r", [ids_of(tok, "x"), ids_of(tok, " #"), ids_of(tok, "#")],
                        last=dict(finish_reason=FinishReason.LENGTH))
    assert [o.delta_text for o in outputs] == ["x", " ", "##"]
    assert [o.text for o in outputs] == ["x", "x ", "x ##"]
    assert outputs[-1].finish_reason is FinishReason.LENGTH and outputs[-1].stop_reason is None


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_id_text(processor, tok, include):
    newline = tok.encode("\n", add_special_tokens=False)[0]
    add(processor, stop_token_ids=[newline], include_stop_str_in_output=include)
    token_ids = ids_of(tok, "line one") + [newline]
    (final,) = run_steps(processor, "r", [token_ids], last=dict(finish_reason=FinishReason.STOP,
                                                                 stop_reason=newline))
    assert final.token_ids == token_ids and final.stop_reason == newline
    assert final.text == ("line one\n" if include else "line one")


def test_grammar_completion_keeps_last_token_text(processor, tok):
    add(processor)
    token_ids = ids_of(tok, '{"a": 1', "}")
    (final,) = run_steps(processor, "r", [token_ids], last=dict(finish_reason=FinishReason.STOP))
    assert final.text == '{"a": 1}' and final.stop_reason is None


def test_non_streaming_returns_only_the_final_output(processor, tok):
    add(processor, stream=False)
    steps = [ids_of(tok, "one"), ids_of(tok, " two"), ids_of(tok, " three")]
    outputs = run_steps(processor, "r", steps, last=dict(finish_reason=FinishReason.LENGTH))
    (final,) = outputs
    assert final.text == final.delta_text == "one two three"
    assert final.token_ids == final.new_token_ids == [t for s in steps for t in s]
    assert final.finish_reason is FinishReason.LENGTH


def test_error_finish(processor):
    add(processor)
    (final,), to_abort = processor.process_outputs(
        [core_output("r", [], FinishReason.ERROR, error="schema rejected: bad $ref")])
    assert to_abort == []
    assert final.finished and final.finish_reason is FinishReason.ERROR
    assert final.error == "schema rejected: bad $ref" and final.text == "" and final.token_ids == []


def test_abort_returns_partial_output(processor, tok, clock):
    add(processor)
    run_steps(processor, "r", [ids_of(tok, "partial answer")])
    clock.now += 2.0
    final = processor.abort("r")
    assert final.finished and final.finish_reason is FinishReason.ABORT
    assert final.text == "partial answer" and final.delta_text == "" and final.timings.total_s == 2.0
    assert processor.abort("r") is None
    assert processor.process_outputs([core_output("r", ids_of(tok, "x"))]) == ([], [])


def test_interleaved_requests(processor, tok):
    add(processor, "a")
    add(processor, "b", stop=["!"])
    add(processor, "c", stream=False)
    outputs, to_abort = processor.process_outputs([
        core_output("a", ids_of(tok, "alpha")),
        core_output("b", ids_of(tok, "beta", "!", " more")),
        core_output("c", ids_of(tok, "gamma")),
    ])
    assert to_abort == ["b"]
    assert [(o.request_id, o.text, o.finished) for o in outputs] == [("a", "alpha", False), ("b", "beta", True)]
    outputs, _ = processor.process_outputs([core_output("c", [EOS], FinishReason.STOP, stop_reason=EOS),
                                            core_output("a", [EOS], FinishReason.STOP, stop_reason=EOS)])
    assert [(o.request_id, o.text) for o in outputs] == [("c", "gamma"), ("a", "alpha")]
    assert not processor.has_unfinished()


def test_duplicate_request_id(processor):
    add(processor)
    with pytest.raises(ValueError, match="already in use"):
        add(processor)


def test_logprobs_only_for_sampled_tokens(processor, tok):
    """Jump-forward tokens carry no logprobs; new_logprobs still holds exactly the new ones."""
    add(processor, logprobs=1)
    sampled, forced = ids_of(tok, "{"), ids_of(tok, '"name": "')
    lp = TokenLogprob(sampled[0], -0.1, top=[(sampled[0], -0.1), (5, -3.0)])
    (o1,), _ = processor.process_outputs([core_output("r", sampled + forced, new_logprobs=[lp])])
    assert o1.token_ids == sampled + forced and o1.new_logprobs == [lp] and o1.logprobs == [lp]
    lp2 = TokenLogprob(ids_of(tok, "Bob")[0], -0.2)
    (o2,), _ = processor.process_outputs([core_output("r", ids_of(tok, "Bob"), new_logprobs=[lp2])])
    assert o2.new_logprobs == [lp2] and o2.logprobs == [lp, lp2]
    assert o2.text == '{"name": "Bob'


def test_no_logprobs_unless_requested(processor, tok):
    add(processor)
    (o,), _ = processor.process_outputs([core_output("r", ids_of(tok, "x"), new_logprobs=[TokenLogprob(1, -1.0)])])
    assert o.logprobs is None and o.new_logprobs is None
