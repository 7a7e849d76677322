// Constraint builders: the shape the output must have (formwork.v1.Constraint, as a plain object).
// Options left undefined are not sent, so the server's defaults apply: strict true (unenforceable
// JSON-Schema keywords are an error), whitespace the server's default JSON whitespace ("compact",
// "spaced", "bounded" or "any"; docs/constraints.md), anyWhitespace false, jumpForward the server's,
// closeEarly the server's (on unless started with --no-close-early: the output is closed before
// max_tokens runs out, or when it loops, and the response's closed_early says so), grammarBackend
// the server's ("auto", "xgrammar" or "llguidance"; the response's grammar_backend names the one that
// served the request).

import { createHash } from "node:crypto";

// The call metadata that carries constraintKey(): a load balancer in front of several servers hashes
// it, so one constraint keeps meeting the same server's warm compile cache (docs/deploy.md).
export const CONSTRAINT_KEY_HEADER = "x-formwork-constraint-key";

// the Constraint oneof `kind`, as its fields are named
export const KINDS = ["json_schema", "json_schema_text", "json_object", "regex", "grammar", "choice", "structural_tag"];

const WHITESPACE = { compact: "JSON_WHITESPACE_COMPACT", spaced: "JSON_WHITESPACE_SPACED",
  bounded: "JSON_WHITESPACE_BOUNDED", any: "JSON_WHITESPACE_ANY" };

const GRAMMAR_BACKENDS = { auto: "GRAMMAR_BACKEND_AUTO", xgrammar: "GRAMMAR_BACKEND_XGRAMMAR",
  llguidance: "GRAMMAR_BACKEND_LLGUIDANCE" };

/** A JSON Schema (an object, or JSON text), sent as text so property order and numbers are kept. */
export function jsonSchema(schema, { strict, anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend } = {}) {
  const text = typeof schema === "string" ? schema : JSON.stringify(schema);
  return withOptions({ json_schema_text: text },
    { strict, anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend });
}

/** Any JSON object. */
export function jsonObject({ anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend } = {}) {
  return withOptions({ json_object: {} }, { anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend });
}

/** A regular expression the whole output must match. */
export function regex(pattern, { strict, jumpForward, grammarBackend } = {}) {
  return withOptions({ regex: pattern }, { strict, jumpForward, grammarBackend });
}

/** An EBNF grammar (xgrammar's GBNF dialect) whose start rule is named `root`. */
export function grammar(ebnf, { strict, jumpForward, grammarBackend } = {}) {
  return withOptions({ grammar: ebnf }, { strict, jumpForward, grammarBackend });
}

/** Exactly one of the given non-empty strings. */
export function choice(choices, { jumpForward, grammarBackend } = {}) {
  if (!Array.isArray(choices)) {
    throw new TypeError("choice() takes an array of strings");
  }
  return withOptions({ choice: { choices } }, { jumpForward, grammarBackend });
}

/**
 * A structural tag (an object, or JSON text): xgrammar's {type: "structural_tag", format: {...}}, or
 * the older {type: "structural_tag", structures: [{begin, schema, end}], triggers: [...]}: free text
 * until a trigger, then the tag's content in its schema up to its end (docs/constraints.md). The
 * options apply to the JSON Schemas inside it.
 */
export function structuralTag(tag, { strict, anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend } = {}) {
  const text = typeof tag === "string" ? tag : JSON.stringify(tag);
  return withOptions({ structural_tag: text },
    { strict, anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend });
}

function withOptions(constraint, { strict, anyWhitespace, jumpForward, whitespace, closeEarly, grammarBackend }) {
  // proto3 `optional` fields: present only when chosen
  if (whitespace !== undefined) {
    if (!(whitespace in WHITESPACE)) {
      throw new TypeError(`whitespace must be one of ${Object.keys(WHITESPACE).join(", ")}, not ${whitespace}`);
    }
    constraint.whitespace = WHITESPACE[whitespace];
  }
  if (strict !== undefined) constraint.strict = strict;
  if (anyWhitespace !== undefined) constraint.any_whitespace = anyWhitespace;
  if (jumpForward !== undefined) constraint.jump_forward = jumpForward;
  if (closeEarly !== undefined) constraint.close_early = closeEarly;
  if (grammarBackend !== undefined) {
    if (!(grammarBackend in GRAMMAR_BACKENDS)) {
      throw new TypeError(`grammarBackend must be one of ${Object.keys(GRAMMAR_BACKENDS).join(", ")}, not ${grammarBackend}`);
    }
    constraint.grammar_backend = GRAMMAR_BACKENDS[grammarBackend];
  }
  return constraint;
}

/**
 * A short hash of what a constraint compiles from (its kind and text; options not included), or
 * undefined without one: the same key the Python client's constraint_key gives (JSON Schema text
 * counts in its compact form, key order kept).
 */
export function constraintKey(constraint) {
  const kind = constraint ? KINDS.find((name) => constraint[name] !== undefined && constraint[name] !== null) : undefined;
  if (kind === undefined) return undefined;
  let spec;
  if (kind === "json_schema") spec = JSON.stringify(sortedKeys(constraint.json_schema));
  else if (kind === "json_schema_text" || kind === "structural_tag") spec = compactJson(constraint[kind]);
  else if (kind === "choice") spec = constraint.choice.choices.join("\0");
  else if (kind === "json_object") spec = "";
  else spec = constraint[kind];
  return createHash("sha256").update(`${kind}\0${spec}`, "utf8").digest("hex").slice(0, 32);
}

function compactJson(text) {
  try {
    return JSON.stringify(JSON.parse(text));
  } catch {
    return text; // the server will say what is wrong; any stable key will do
  }
}

function sortedKeys(value) {
  if (Array.isArray(value)) return value.map(sortedKeys);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(Object.keys(value).sort().map((key) => [key, sortedKeys(value[key])]));
}
