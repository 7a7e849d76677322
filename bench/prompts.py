"""Deterministic benchmark prompts (chat conversations) of mixed lengths."""
from __future__ import annotations

_TOPICS = [
    "the water cycle", "how a bicycle gear works", "the history of paper", "why the sky is blue",
    "photosynthesis", "how vaccines train the immune system", "the rules of chess", "volcanoes",
    "the French Revolution", "how compilers work", "black holes", "the life of bees",
    "how to bake bread", "the Roman aqueducts", "ocean tides", "how batteries store energy",
]
_ASKS = [
    "Explain {} to a curious ten-year-old.",
    "Write a short essay about {}.",
    "Give me five surprising facts about {}, with a sentence on each.",
    "Summarize what an expert would want a beginner to know about {}.",
]


def chat_prompts(num_prompts: int) -> list[list[dict]]:
    prompts = []
    for i in range(num_prompts):
        ask = _ASKS[i % len(_ASKS)].format(_TOPICS[i % len(_TOPICS)])
        if i % 3 == 0:  # mixed lengths
            ask += " Please be thorough, organise your answer in paragraphs, and finish with a one-line summary."
        prompts.append([{"role": "user", "content": ask}])
    return prompts
