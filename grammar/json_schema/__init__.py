"""A JSON schema rewritten into an equivalent or narrower one a backend enforces: the walk, the
merge of conjunctions, complements, disjointness proofs and the rewrite rules. Pure JSON -> JSON."""
