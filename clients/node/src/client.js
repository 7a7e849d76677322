// FormworkClient: one gRPC channel to a Formwork server, with promise-returning calls.
//
// Requests and responses are plain objects with the proto's own field names (snake_case, as in
// grpcurl's JSON): { prompt: "...", max_tokens: 16, constraint: regex("[0-9]+") }. In responses,
// enums are their names ("FINISH_REASON_STOP"), 64-bit integers are numbers, and unset fields
// have their defaults. A failed call rejects with a FormworkError.
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

import { CONSTRAINT_KEY_HEADER, constraintKey } from "./constraints.js";
import { fromServiceError } from "./errors.js";
import { extractionValue, extractMany, extractRequest } from "./extraction.js";

export const DEFAULT_ADDRESS = "127.0.0.1:50051"; // what `make serve` listens on
export const PROTO_ROOT = fileURLToPath(new URL("../../../proto", import.meta.url));

const LOADER_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };

/** The Generation service constructor, loaded from the .proto files under `protoRoot`. */
export function loadGenerationService(protoRoot = PROTO_ROOT) {
  const definition = protoLoader.loadSync("formwork/v1/generation.proto", { ...LOADER_OPTIONS, includeDirs: [protoRoot] });
  return grpc.loadPackageDefinition(definition).formwork.v1.Generation;
}

export class FormworkClient {
  /**
   * @param {string} address  host:port of `formwork serve`
   * @param {object} [options]
   * @param {number} [options.timeoutMs]  default deadline of every call (none if unset)
   * @param {string} [options.apiKey]  sent with every call as `authorization: Bearer KEY`
   *   (default: $FORMWORK_API_KEY, if set)
   * @param {boolean} [options.tls]  TLS trusting the system's CAs (implied by the PEM options)
   * @param {Buffer} [options.rootCerts]  PEM of the CA to trust (e.g. a self-signed server certificate)
   * @param {Buffer} [options.privateKey]  mutual TLS: the client's private key (PEM)
   * @param {Buffer} [options.certChain]  mutual TLS: the client's certificate chain (PEM)
   * @param {grpc.ChannelCredentials} [options.credentials]  credentials of your own instead of the above
   * @param {string} [options.protoRoot]  where proto/ is (default: the repository's)
   * @param {object} [options.channelOptions]  gRPC channel options
   */
  constructor(address = DEFAULT_ADDRESS, { timeoutMs, apiKey, tls, rootCerts, privateKey, certChain, credentials,
    protoRoot, channelOptions } = {}) {
    const Generation = loadGenerationService(protoRoot);
    const secure = tls ?? [rootCerts, privateKey, certChain].some((pem) => pem !== undefined);
    const channelCredentials = credentials
      ?? (secure ? grpc.credentials.createSsl(rootCerts ?? null, privateKey ?? null, certChain ?? null)
        : grpc.credentials.createInsecure());
    this.stub = new Generation(address, channelCredentials, channelOptions);
    this.timeoutMs = timeoutMs;
    this.apiKey = apiKey ?? (process.env.FORMWORK_API_KEY || undefined);
  }

  /**
   * The whole answer: a GenerateResponse for a GenerateRequest object. Aborting `signal` (an
   * AbortSignal) cancels the call, on the server too; it then rejects with CANCELLED.
   */
  generate(request, { timeoutMs, signal } = {}) {
    return this.#unary("Generate", request, timeoutMs, signal);
  }

  /**
   * The answer as it is produced (`for await`): each response carries the text and token ids it
   * adds; the last one has finish_reason, usage and timings. Leaving the loop early cancels the
   * request on the server.
   */
  async *stream(request, { timeoutMs } = {}) {
    const call = this.stub.GenerateStream(request, this.#metadata(request), this.#callOptions(timeoutMs));
    try {
      for await (const response of call) {
        yield response;
      }
    } catch (error) {
      throw fromServiceError(error);
    } finally {
      call.cancel(); // a no-op once the stream ended
    }
  }

  /**
   * Schema-constrained extraction in one call: the JSON value in `text` that `schema` describes,
   * parsed (an object for an object schema). Sends extractPrompt() as the user's message with the
   * schema as the constraint; greedy unless `temperature` is given. `speculative` switches drafting
   * from the prompt on or off for this call (default: the server's); the answer is the same either way.
   * Rejects with FormworkError (INVALID_ARGUMENT for a schema the server cannot enforce), or
   * IncompleteOutputError if maxTokens ran out before the JSON was complete.
   */
  async extract(schema, text, { timeoutMs, ...options } = {}) {
    return extractionValue(await this.generate(extractRequest(schema, text, options), { timeoutMs }));
  }

  /**
   * extract() over many documents, at most `concurrency` calls in flight. `documents`: strings,
   * [id, text] pairs, or objects with `text` and `id`. Each document's outcome is a result
   * { index, id, value, text, usage: { promptTokens, completionTokens }, error, attempts, ok }: a
   * document that fails has its error in its result (a FormworkError with `code` and `details`, or
   * IncompleteOutputError), nothing is thrown for it. UNAVAILABLE, and RESOURCE_EXHAUSTED from an
   * overloaded server, are retried up to `maxRetries` times after a random delay below
   * backoffMs * 2**retry (at most maxBackoffMs). `onProgress(done, total, failed)` is called as
   * each document finishes; `timeoutMs` is each call's; the other options are extract()'s.
   *
   * ordered (default): a Promise of the results in input order. ordered: false: an async iterator
   * of the results as they complete (`for await`); leaving the loop early cancels the calls in
   * flight. Throws TypeError / RangeError for bad arguments before anything is sent.
   */
  extractMany(documents, schema, { timeoutMs, ...options } = {}) {
    return extractMany((request, { signal }) => this.generate(request, { timeoutMs, signal }), documents, schema,
      options);
  }

  /**
   * Compile a constraint without generating: { ok, error, compile_s, cached, not_enforced,
   * grammar_backend } (the library a request with it is served by).
   */
  validateConstraint(constraint, { timeoutMs } = {}) {
    return this.#unary("ValidateConstraint", { constraint }, timeoutMs);
  }

  /** The model, the server's limits, and its live load. */
  modelInfo({ timeoutMs } = {}) {
    return this.#unary("GetModelInfo", {}, timeoutMs);
  }

  /**
   * The prompt token ids generate() would use: { prompt } or { chat }, with the request's `tools`
   * and `reasoning` so a chat renders as generate() renders it.
   */
  tokenize(request, { timeoutMs } = {}) {
    return this.#unary("Tokenize", request, timeoutMs);
  }

  close() {
    this.stub.close();
  }

  #unary(method, request, timeoutMs, signal) {
    return new Promise((resolve, reject) => {
      const cancel = () => call.cancel();
      const call = this.stub[method](request, this.#metadata(request), this.#callOptions(timeoutMs), (error, response) => {
        signal?.removeEventListener("abort", cancel);
        if (error) {
          reject(fromServiceError(error));
        } else {
          resolve(response);
        }
      });
      if (signal?.aborted) {
        cancel();
      } else {
        signal?.addEventListener("abort", cancel, { once: true });
      }
    });
  }

  #metadata(request) {
    const metadata = new grpc.Metadata();
    if (this.apiKey) metadata.set("authorization", `Bearer ${this.apiKey}`);
    const key = constraintKey(request.constraint);
    if (key !== undefined) metadata.set(CONSTRAINT_KEY_HEADER, key);
    return metadata;
  }

  #callOptions(timeoutMs) {
    const ms = timeoutMs ?? this.timeoutMs;
    return ms === undefined ? {} : { deadline: new Date(Date.now() + ms) };
  }
}
