"""Everything about output constraints, in layers (pyproject.toml's contracts hold them):

* xgrammar/: the one backend, the only package that imports xgrammar or knows its formats;
* compiler.py (the engine's cached, time-limited compiles) and runtime/ (what runs beside a
  request's matcher: closing search, early closing, runaway guard, jump-forward, fill budgets);
* json_schema/: a schema rewritten into one a backend enforces (walk, merge, negation, rules);
* backend.py (the ABCs: one compiler per engine, one matcher per request) and bitmask.py;
* constraint.py and config.py: what a request asks for, and the engine's bounds;
* chat/ (tool-call syntaxes, think markers) and regex/ (patterns read once, and analysed).
"""
