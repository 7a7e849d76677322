// Schema-constrained extraction: the request extract() sends for one document, and extractMany()'s
// run over many: at most `concurrency` calls in flight, transient failures retried with exponential
// backoff and jitter, and every document's outcome a result (a failed document's error is in its
// result, never thrown). The Python client's formwork_client.extraction does the same.
import { setTimeout as sleep } from "node:timers/promises";

import { jsonSchema } from "./constraints.js";
import { FormworkError, IncompleteOutputError, isTransient } from "./errors.js";

/**
 * The user message extract() sends: the text, then the instructions, by default "Extract <the
 * object's property names> from this text as JSON." (the schema itself is the constraint, not part
 * of the prompt; the Python client's extract_prompt builds the same message and says why).
 */
export function extractPrompt(schema, text, instructions) {
  if (instructions === undefined) {
    const parsed = typeof schema === "string" ? JSON.parse(schema) : schema;
    const properties = parsed !== null && typeof parsed === "object" ? parsed.properties : undefined;
    const names = properties && typeof properties === "object" ? Object.keys(properties) : [];
    instructions = `Extract ${names.length ? names.join(", ") : "the information"} from this text as JSON.`;
  }
  return `${text}\n\n${instructions}`;
}

// the options of extractRequest() that extractMany() applies to every document's request
const DOCUMENT_OPTIONS = ["instructions", "maxTokens", "temperature", "strict", "anyWhitespace", "jumpForward",
  "whitespace", "closeEarly", "speculative"];

/** The GenerateRequest extract() sends: extractPrompt() as the user's message, the schema as the constraint. */
export function extractRequest(schema, text, { instructions, maxTokens, temperature = 0, strict, anyWhitespace,
  jumpForward, whitespace, closeEarly, speculative, requestId } = {}) {
  const request = {
    chat: { messages: [{ role: "user", content: extractPrompt(schema, text, instructions) }] },
    temperature,
    constraint: jsonSchema(schema, { strict, anyWhitespace, jumpForward, whitespace, closeEarly }),
  };
  if (maxTokens !== undefined) request.max_tokens = maxTokens;
  if (requestId !== undefined) request.request_id = requestId;
  if (speculative !== undefined) request.speculative = speculative;
  return request;
}

/** The parsed JSON of a finished extraction; throws IncompleteOutputError unless the JSON was complete. */
export function extractionValue(response) {
  if (response.finish_reason !== "FINISH_REASON_STOP") {
    throw new IncompleteOutputError(response);
  }
  return JSON.parse(response.text);
}

/**
 * Milliseconds to wait before sending a call again after `error`, when `numRetries` retries were
 * made already, or null to give up: only transient errors (isTransient) are retried, at most
 * `maxRetries` times, after a delay drawn uniformly from [0, min(maxBackoffMs, backoffMs * 2**retry)]
 * (full jitter, so documents refused together do not come back together), never sooner than the
 * delay the server asked for.
 */
export function retryDelayMs(error, numRetries, { maxRetries, backoffMs, maxBackoffMs }, uniform = Math.random) {
  if (numRetries >= maxRetries || !isTransient(error)) return null;
  return Math.max(uniform() * Math.min(maxBackoffMs, backoffMs * 2 ** numRetries), error.retryAfterMs ?? 0);
}

/** The documents as { id, text }: strings, [id, text] pairs, or objects with `text` (and `id`). */
export function toDocuments(documents) {
  if (typeof documents === "string" || documents === null || typeof documents?.[Symbol.iterator] !== "function") {
    throw new TypeError(`documents must be an array of documents, got ${describe(documents)}`);
  }
  return Array.from(documents, (document, index) => {
    if (typeof document === "string") return { id: null, text: document };
    if (Array.isArray(document) && document.length === 2 && typeof document[1] === "string") {
      return { id: document[0], text: document[1] };
    }
    if (document !== null && typeof document === "object" && typeof document.text === "string") {
      return { id: document.id ?? null, text: document.text };
    }
    throw new TypeError(`documents[${index}]: expected a string, an [id, text] pair or an object with a string ` +
      `text (and an id), got ${describe(document)}`);
  });
}

/**
 * extractMany's run (FormworkClient.extractMany documents its options). `generate(request, { signal })`
 * sends one call. Throws TypeError / RangeError for bad arguments before anything is sent.
 */
export function extractMany(generate, documents, schema, { concurrency = 8, onProgress, ordered = true,
  maxRetries = 4, backoffMs = 500, maxBackoffMs = 30_000, ...options } = {}) {
  if (typeof schema !== "string" && typeof schema !== "boolean" && (schema === null || typeof schema !== "object")) {
    throw new TypeError(`schema must be a JSON Schema (an object, JSON text or a boolean), got ${describe(schema)}`);
  }
  checkInteger("concurrency", concurrency, 1);
  checkInteger("maxRetries", maxRetries, 0);
  for (const [name, value] of Object.entries({ backoffMs, maxBackoffMs })) {
    if (!(value >= 0)) throw new RangeError(`${name} must be >= 0, got ${value}`);
  }
  if (onProgress !== undefined && typeof onProgress !== "function") {
    throw new TypeError("onProgress must be a function (done, total, failed)");
  }
  const unknown = Object.keys(options).filter((name) => !DOCUMENT_OPTIONS.includes(name));
  if (unknown.length) {
    throw new TypeError(`extractMany got unknown options: ${unknown.join(", ")}` +
      (unknown.includes("requestId") ? " (each document is a request of its own)" : ""));
  }
  const job = {
    documents: toDocuments(documents),
    concurrency, onProgress, retry: { maxRetries, backoffMs, maxBackoffMs }, generate,
  };
  job.requests = job.documents.map(({ text }) => extractRequest(schema, text, options));
  const results = asCompleted(job);
  return ordered ? inInputOrder(results, job.documents.length) : results;
}

async function* asCompleted(job) {
  const total = job.documents.length;
  const stop = new AbortController(); // the reader stopped, or all is done: cancel what is in flight
  const finished = []; // results (or a bug, thrown to the reader) not yet read
  let wake = () => {};
  const push = (item) => {
    finished.push(item);
    wake();
  };
  let nextIndex = 0; // shared: each worker takes the next document
  const worker = async () => {
    while (nextIndex < total && !stop.signal.aborted) {
      const index = nextIndex++;
      const result = await extractOne(job, index, stop.signal);
      if (result !== null) push(result);
    }
  };
  for (let i = 0; i < Math.min(job.concurrency, total); i++) {
    worker().catch((error) => push({ bug: error }));
  }
  let done = 0;
  let failed = 0;
  try {
    while (done < total) {
      if (finished.length === 0) {
        await new Promise((resolve) => { wake = resolve; });
        continue;
      }
      const item = finished.shift();
      if (item.bug !== undefined) throw item.bug;
      done += 1;
      failed += item.ok ? 0 : 1;
      job.onProgress?.(done, total, failed);
      yield item;
    }
  } finally {
    stop.abort();
  }
}

/** One document's result, or null if the run was stopped meanwhile. */
async function extractOne(job, index, signal) {
  const { id } = job.documents[index];
  for (let numRetries = 0; ; numRetries++) {
    const attempts = numRetries + 1;
    let response;
    try {
      response = await job.generate(job.requests[index], { signal });
    } catch (error) {
      if (signal.aborted) return null;
      if (!(error instanceof FormworkError)) throw error;
      const delay = retryDelayMs(error, numRetries, job.retry);
      if (delay === null) return result(index, id, { error, attempts });
      try {
        await sleep(delay, undefined, { signal });
      } catch {
        return null; // aborted while waiting
      }
      continue;
    }
    const usage = {
      promptTokens: response.usage?.prompt_tokens ?? 0, completionTokens: response.usage?.completion_tokens ?? 0,
    };
    try {
      return result(index, id, { value: extractionValue(response), text: response.text, usage, attempts });
    } catch (error) {
      if (!(error instanceof IncompleteOutputError)) throw error;
      return result(index, id, { text: response.text, usage, error, attempts });
    }
  }
}

function result(index, id, { value = null, text = "", usage = { promptTokens: 0, completionTokens: 0 }, error = null,
  attempts }) {
  return { index, id, value, text, usage, error, attempts, ok: error === null };
}

async function inInputOrder(results, total) {
  const ordered = new Array(total);
  for await (const result of results) {
    ordered[result.index] = result;
  }
  return ordered;
}

function checkInteger(name, value, min) {
  if (!Number.isInteger(value) || value < min) {
    throw new RangeError(`${name} must be an integer >= ${min}, got ${value}`);
  }
}

function describe(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return `an array of ${value.length}`;
  return typeof value === "string" ? "one string" : `a ${typeof value}`;
}
