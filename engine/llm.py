"""The offline API: `LLM().generate(prompts, params)`, the same engine the server runs, in-process."""
from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Union

from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.frontend.output_processor import OutputProcessor, RequestOutput
from engine.frontend.tokenizer import Tokenizer
from engine.protocol import EngineCoreRequest
from engine.sampling_params import SamplingParams

# a prompt: raw text, a chat conversation (rendered with the chat template), or token ids
Prompt = Union[str, list[dict], dict]


class LLM:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig()
        if model is not None:
            config = replace(config, model=model)
        self.engine = EngineCore(config)
        self.tokenizer = Tokenizer.from_model_dir(self.engine.model_dir)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs 'prompt_token_ids'")
            return list(prompt["prompt_token_ids"])
        if isinstance(prompt, list):
            return self.tokenizer.encode_chat(prompt)
        raise ValueError(f"a prompt is a string, a list of chat messages or a dict, not {type(prompt).__name__}")

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order.

        Every request is validated before any is queued: one bad prompt or parameter raises
        ValueError (naming it and its index) and nothing runs.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)
                                                and "role" in prompts[0]):
            prompts = [prompts]  # one prompt, not a batch
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} SamplingParams")
        requests = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            try:
                request = EngineCoreRequest(f"offline-{next(self._ids)}", self.encode_prompt(prompt), p,
                                            arrival_time=time.monotonic())
                self.engine.validate_request(request)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
            requests.append(request)
        for request in requests:
            self.output_processor.add_request(request.request_id, request.prompt_token_ids,
                                              request.sampling_params, request.arrival_time, stream=False)
            self.engine.add_request(request)
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(requests):
            outputs, to_abort = self.output_processor.process_outputs(self.engine.step())
            if to_abort:
                self.engine.abort_requests(to_abort)
            for out in outputs:
                if out.finished:
                    finished[out.request_id] = out
        return [finished[r.request_id] for r in requests]

    def shutdown(self) -> None:
        self.engine.shutdown()
