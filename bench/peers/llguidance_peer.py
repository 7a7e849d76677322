"""Peer (compile only): llguidance's JSON-schema compiler on the same schemas as `bench coverage`.

A standalone script for .peers/vllm/bin/python (llguidance comes with vLLM; `make peer-vllm`).
Not a generation peer: it speaks its own small contract over stdin/stdout,

    stdin:  {"tokenizer_dir": ..., "schemas": [{"id": ..., "schema": {...}}]}
    stdout: (last line) {"peer": "llguidance", "version": ...,
             "results": [{"id": ..., "ok": bool, "error": "...", "compile_s": ...}]}
            or {"skipped": "why"}

Each schema goes through `LLMatcher.grammar_from_json_schema` (its defaults: unimplemented
keywords are errors, not ignored; compact separators, no free whitespace, as Formwork compiles)
and then `LLMatcher.validate_grammar` with the tokenizer, which builds the lexer; `compile_s`
is both together.
"""
from __future__ import annotations

import json
import sys
import time


def main() -> int:
    payload = json.load(sys.stdin)
    try:
        import llguidance
        import llguidance.hf
        from transformers import AutoTokenizer
    except ImportError as e:
        print(json.dumps({"skipped": f"llguidance is not importable here: {e}"}))
        return 0
    tokenizer = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(payload["tokenizer_dir"]))
    options = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    results = []
    for item in payload["schemas"]:
        started = time.perf_counter()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(item["schema"], defaults=options)
            error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        except (ValueError, RuntimeError) as e:
            error = str(e)
        results.append({"id": item["id"], "ok": not error, "error": error[:300],
                        "compile_s": time.perf_counter() - started})
    version = getattr(llguidance, "__version__", None)
    if version is None:
        from importlib.metadata import version as package_version
        version = package_version("llguidance")
    print(json.dumps({"peer": "llguidance", "version": f"llguidance {version}", "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
