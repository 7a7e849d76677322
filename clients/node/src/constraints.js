// Constraint builders: the shape the output must have (formwork.v1.Constraint, as a plain object).
// Options left undefined are not sent, so the server's defaults apply: strict true (unenforceable
// JSON-Schema keywords are an error), whitespace the server's default JSON whitespace ("compact",
// "spaced", "bounded" or "any"; docs/constraints.md), anyWhitespace false, jumpForward the server's.

const WHITESPACE = { compact: "JSON_WHITESPACE_COMPACT", spaced: "JSON_WHITESPACE_SPACED",
  bounded: "JSON_WHITESPACE_BOUNDED", any: "JSON_WHITESPACE_ANY" };

/** A JSON Schema (an object, or JSON text), sent as text so property order and numbers are kept. */
export function jsonSchema(schema, { strict, anyWhitespace, jumpForward, whitespace } = {}) {
  const text = typeof schema === "string" ? schema : JSON.stringify(schema);
  return withOptions({ json_schema_text: text }, { strict, anyWhitespace, jumpForward, whitespace });
}

/** Any JSON object. */
export function jsonObject({ anyWhitespace, jumpForward, whitespace } = {}) {
  return withOptions({ json_object: {} }, { anyWhitespace, jumpForward, whitespace });
}

/** A regular expression the whole output must match. */
export function regex(pattern, { strict, jumpForward } = {}) {
  return withOptions({ regex: pattern }, { strict, jumpForward });
}

/** An EBNF grammar (xgrammar's GBNF dialect) whose start rule is named `root`. */
export function grammar(ebnf, { strict, jumpForward } = {}) {
  return withOptions({ grammar: ebnf }, { strict, jumpForward });
}

/** Exactly one of the given non-empty strings. */
export function choice(choices, { jumpForward } = {}) {
  if (!Array.isArray(choices)) {
    throw new TypeError("choice() takes an array of strings");
  }
  return withOptions({ choice: { choices } }, { jumpForward });
}

function withOptions(constraint, { strict, anyWhitespace, jumpForward, whitespace }) {
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
  return constraint;
}
