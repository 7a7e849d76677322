// FormworkClient.extractMany over a fake stub (no server): a scripted Generate that answers each
// document, fails it, or holds it until the test lets it go, so ordering, retries, per-document
// errors, progress and the concurrency bound are checked without a model or a clock.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";

import { extractPrompt, FormworkClient, FormworkError, IncompleteOutputError, retryDelayMs } from "formwork-client";
import { fromServiceError } from "../src/errors.js";

const SCHEMA = { type: "object", properties: { name: { type: "string", maxLength: 20 } }, required: ["name"] };
const LOADING = { code: grpc.status.UNAVAILABLE, details: "the model is still loading; retry once health reports SERVING" };
// an overloaded server's refusal carries a retry delay: a google.rpc.RetryInfo in the trailers
const QUEUE_FULL = { code: grpc.status.RESOURCE_EXHAUSTED,
  details: "the queue is full: 32 requests in flight (16 running + 16 waiting at most); retry later", retryAfterMs: 50 };
const TOO_LARGE = { code: grpc.status.RESOURCE_EXHAUSTED, details: "the request needs 900 tokens of KV cache; the engine has 512" };
const BAD_SCHEMA = { code: grpc.status.INVALID_ARGUMENT, details: "constraint.json_schema_text: json_schema does not compile" };

// the trailers a server sends with a refusal: a google.rpc.Status, with a RetryInfo when `retryAfterMs` is set
const rpc = protobuf.parse(`
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message Duration { int64 seconds = 1; int32 nanos = 2; }
  message RetryInfo { Duration retry_delay = 1; }
`, { keepCase: true }).root;

function trailers(retryAfterMs) {
  const metadata = new grpc.Metadata();
  if (retryAfterMs === undefined) return metadata;
  const RetryInfo = rpc.lookupType("google.rpc.RetryInfo");
  const retry = RetryInfo.encode({ retry_delay: { seconds: Math.floor(retryAfterMs / 1000),
    nanos: (retryAfterMs % 1000) * 1e6 } }).finish();
  const status = rpc.lookupType("google.rpc.Status").encode({ code: grpc.status.RESOURCE_EXHAUSTED,
    details: [{ type_url: "type.googleapis.com/google.rpc.RetryInfo", value: retry }] }).finish();
  metadata.set("grpc-status-details-bin", Buffer.from(status));
  return metadata;
}

const documentText = (request) => request.chat.messages[0].content.split("\n\n")[0];

/**
 * The Generate of a grpc-js stub. Each document's calls follow its script, then get the answer
 * {"name": <text>}: a script entry { code, details } fails that call, "length" answers with output
 * cut off by max_tokens. A document in `held` waits until release(text); cancel() ends a call CANCELLED.
 */
class FakeStub {
  constructor(scripts = {}, held = []) {
    this.scripts = Object.fromEntries(Object.entries(scripts).map(([text, outcomes]) => [text, [...outcomes]]));
    this.calls = []; // { request, options, metadata }
    this.completed = []; // texts, in the order their calls returned
    this.cancelled = [];
    this.numInFlight = 0;
    this.maxInFlight = 0;
    this.gates = new Map(held.map((text) => [text, withResolvers()]));
  }

  release(text) {
    this.gates.get(text).resolve();
  }

  sentTexts() {
    return this.calls.map(({ request }) => documentText(request));
  }

  Generate(request, metadata, options, callback) {
    const text = documentText(request);
    this.calls.push({ request, options, metadata });
    this.numInFlight += 1;
    this.maxInFlight = Math.max(this.maxInFlight, this.numInFlight);
    let ended = false;
    const end = (error, response) => {
      if (ended) return;
      ended = true;
      this.numInFlight -= 1;
      this.completed.push(text);
      callback(error, response);
    };
    (this.gates.get(text)?.promise ?? Promise.resolve()).then(() => setImmediate(() => {
      const outcome = this.scripts[text]?.shift();
      if (outcome !== undefined && typeof outcome === "object") {
        end({ code: outcome.code, details: outcome.details, metadata: trailers(outcome.retryAfterMs) });
      } else {
        end(null, answer(text, outcome === "length"));
      }
    }));
    return {
      cancel: () => {
        if (!ended) this.cancelled.push(text);
        end({ code: grpc.status.CANCELLED, details: "Cancelled on client" });
      },
    };
  }

  close() {}
}

function answer(text, cut) {
  const output = JSON.stringify({ name: text });
  return cut
    ? { text: output.slice(0, 5), finish_reason: "FINISH_REASON_LENGTH", usage: { prompt_tokens: text.length, completion_tokens: 3 } }
    : { text: output, finish_reason: "FINISH_REASON_STOP", usage: { prompt_tokens: text.length, completion_tokens: 7 } };
}

function withResolvers() {
  let resolve;
  const promise = new Promise((r) => { resolve = r; });
  return { promise, resolve };
}

function clientWith(stub) {
  const client = new FormworkClient("127.0.0.1:1"); // never dialled: the fake stub answers
  client.stub = stub;
  return client;
}

describe("extractMany with a fake stub", () => {
  test("retryDelayMs: doubling up to the cap, full jitter, only transient errors", () => {
    const policy = { maxRetries: 6, backoffMs: 500, maxBackoffMs: 3000 };
    const loading = new FormworkError(LOADING.code, LOADING.details);
    assert.deepEqual([0, 1, 2, 3, 4, 5].map((n) => retryDelayMs(loading, n, policy, () => 1)), [500, 1000, 2000, 3000, 3000, 3000]);
    assert.equal(retryDelayMs(loading, 2, policy, () => 0.25), 500);
    assert.equal(retryDelayMs(loading, 6, policy, () => 1), null); // maxRetries spent
    const queueFull = fromServiceError({ ...QUEUE_FULL, metadata: trailers(QUEUE_FULL.retryAfterMs) });
    assert.equal(queueFull.retryAfterMs, 50);
    assert.equal(retryDelayMs(queueFull, 0, policy, () => 0), 50); // never sooner than the server asked
    assert.equal(retryDelayMs(queueFull, 1, policy, () => 1), 1000); // the backoff when it is longer
    assert.equal(retryDelayMs(new FormworkError(TOO_LARGE.code, TOO_LARGE.details), 0, policy), null);
    assert.equal(retryDelayMs(new FormworkError(BAD_SCHEMA.code, BAD_SCHEMA.details), 0, policy), null);
  });

  test("requests are extract()'s, with the options and the call's deadline", async () => {
    const stub = new FakeStub();
    const results = await clientWith(stub).extractMany(["Ada", "Bob"], SCHEMA,
      { instructions: "Find the name.", maxTokens: 24, timeoutMs: 9000 });
    assert.deepEqual(results.map((r) => r.value), [{ name: "Ada" }, { name: "Bob" }]);
    for (const { request, options, metadata } of stub.calls) {
      assert.equal(request.chat.messages[0].content, extractPrompt(SCHEMA, documentText(request), "Find the name."));
      assert.deepEqual(JSON.parse(request.constraint.json_schema_text), SCHEMA);
      assert.equal(request.max_tokens, 24);
      assert.equal(request.temperature, 0);
      assert.ok(options.deadline instanceof Date);
      assert.equal(metadata.get("x-formwork-constraint-key").length, 1);
    }
  });

  test("results in input order whatever order the calls end in, with progress", async () => {
    const texts = ["first", "second", "third"];
    const stub = new FakeStub({}, texts);
    const progress = [];
    stub.release("third");
    const results = await clientWith(stub).extractMany(texts, SCHEMA, {
      concurrency: 3,
      onProgress: (done, total, failed) => { // each finished document lets the one before it go
        progress.push([done, total, failed]);
        if (done < texts.length) stub.release(texts[texts.length - 1 - done]);
      },
    });
    assert.deepEqual(stub.completed, ["third", "second", "first"]);
    assert.deepEqual(results.map((r) => [r.index, r.id, r.value]),
      [[0, null, { name: "first" }], [1, null, { name: "second" }], [2, null, { name: "third" }]]);
    assert.deepEqual(progress, [[1, 3, 0], [2, 3, 0], [3, 3, 0]]);
    assert.ok(results.every((r) => r.ok && r.attempts === 1 && r.error === null && r.usage.completionTokens === 7));
  });

  test("as completed, and at most `concurrency` calls in flight", async () => {
    const texts = ["doc0", "doc1", "doc2", "doc3", "doc4"];
    const order = ["doc0", "doc2", "doc1", "doc3", "doc4"]; // doc2 is let go before doc1
    const stub = new FakeStub({}, texts);
    stub.release(order[0]);
    const seen = [];
    const results = clientWith(stub).extractMany(texts.map((text) => [`id-${text}`, text]), SCHEMA, {
      concurrency: 3, ordered: false, onProgress: (done) => done < 5 && stub.release(order[done]),
    });
    for await (const result of results) seen.push(result.id);
    assert.deepEqual(seen, order.map((text) => `id-${text}`));
    assert.equal(stub.maxInFlight, 3);
  });

  test("UNAVAILABLE twice then an answer: one result after three calls", async () => {
    const stub = new FakeStub({ b: [LOADING, QUEUE_FULL] });
    const results = await clientWith(stub).extractMany(["a", "b", "c"], SCHEMA, { backoffMs: 0 });
    assert.deepEqual(results.map((r) => r.attempts), [1, 3, 1]);
    assert.deepEqual(results[1].value, { name: "b" });
    assert.equal(stub.sentTexts().filter((text) => text === "b").length, 3);
  });

  test("per-document errors are results, and the others are answered", async () => {
    const stub = new FakeStub({ bad: [BAD_SCHEMA], big: [TOO_LARGE], down: [LOADING, LOADING, LOADING], cut: ["length"] });
    const progress = [];
    const [ok, bad, big, down, cut] = await clientWith(stub).extractMany(["ok", "bad", "big", "down", "cut"], SCHEMA,
      { maxRetries: 2, backoffMs: 0, onProgress: (...counts) => progress.push(counts) });
    assert.ok(ok.ok);
    assert.deepEqual(ok.value, { name: "ok" });
    assert.ok(bad.error instanceof FormworkError);
    assert.equal(bad.error.code, "INVALID_ARGUMENT");
    assert.equal(bad.error.details, BAD_SCHEMA.details);
    assert.equal(bad.value, null);
    assert.equal(bad.attempts, 1);
    assert.equal(big.error.code, "RESOURCE_EXHAUSTED");
    assert.equal(big.attempts, 1); // never fits: not retried
    assert.equal(down.error.code, "UNAVAILABLE");
    assert.equal(down.attempts, 3); // 1 + maxRetries
    assert.ok(cut.error instanceof IncompleteOutputError);
    assert.equal(cut.text, '{"nam');
    assert.deepEqual(cut.usage, { promptTokens: 3, completionTokens: 3 });
    assert.deepEqual(progress.at(-1), [5, 5, 4]);
  });

  test("leaving the loop early cancels the calls in flight and sends no more", async () => {
    const stub = new FakeStub({}, ["b", "c", "d"]);
    const results = clientWith(stub).extractMany(["a", "b", "c", "d"], SCHEMA, { concurrency: 2, ordered: false });
    for await (const result of results) {
      assert.deepEqual(result.value, { name: "a" });
      break;
    }
    assert.deepEqual(stub.cancelled.sort(), ["b", "c"]);
    assert.ok(!stub.sentTexts().includes("d"));
  });

  test("documents of every shape; bad input refused before anything is sent", async () => {
    const stub = new FakeStub();
    const client = clientWith(stub);
    const results = await client.extractMany(["plain", ["t1", "pair"], { id: 7, text: "object" }, { text: "no id" }], SCHEMA);
    assert.deepEqual(results.map((r) => [r.id, r.value.name]), [[null, "plain"], ["t1", "pair"], [7, "object"], [null, "no id"]]);
    assert.deepEqual(await client.extractMany([], SCHEMA), []);
    stub.calls.length = 0;
    assert.throws(() => client.extractMany(["ok", { id: 1, body: "x" }], SCHEMA), /documents\[1\]: expected a string, an \[id, text\] pair/);
    assert.throws(() => client.extractMany("one text", SCHEMA), /documents must be an array of documents, got one string/);
    assert.throws(() => client.extractMany(["x"], SCHEMA, { concurrency: 0 }), /concurrency must be an integer >= 1, got 0/);
    assert.throws(() => client.extractMany(["x"], SCHEMA, { maxToken: 3 }), /unknown options: maxToken/);
    assert.throws(() => client.extractMany(["x"], SCHEMA, { requestId: "r" }), /each document is a request of its own/);
    assert.throws(() => client.extractMany(["x"], 42), /schema must be a JSON Schema \(an object, JSON text or a boolean\), got a number/);
    assert.deepEqual(stub.calls, []);
  });
});
