// FormworkClient: one gRPC channel to a Formwork server, with promise-returning calls.
//
// Requests and responses are plain objects with the proto's own field names (snake_case, as in
// grpcurl's JSON): { prompt: "...", max_tokens: 16, constraint: regex("[0-9]+") }. In responses,
// enums are their names ("FINISH_REASON_STOP"), 64-bit integers are numbers, and unset fields
// have their defaults. A failed call rejects with a FormworkError.
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

import { CONSTRAINT_KEY_HEADER, constraintKey, jsonSchema } from "./constraints.js";
import { fromServiceError, IncompleteOutputError } from "./errors.js";

export const DEFAULT_ADDRESS = "127.0.0.1:50051"; // what `make serve` listens on
export const PROTO_ROOT = fileURLToPath(new URL("../../../proto", import.meta.url));

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

  /** The whole answer: a GenerateResponse for a GenerateRequest object. */
  generate(request, { timeoutMs } = {}) {
    return this.#unary("Generate", request, timeoutMs);
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
  async extract(schema, text, { instructions, maxTokens, temperature = 0, strict, anyWhitespace, jumpForward,
    whitespace, closeEarly, speculative, requestId, timeoutMs } = {}) {
    const request = {
      chat: { messages: [{ role: "user", content: extractPrompt(schema, text, instructions) }] },
      temperature,
      constraint: jsonSchema(schema, { strict, anyWhitespace, jumpForward, whitespace, closeEarly }),
    };
    if (maxTokens !== undefined) request.max_tokens = maxTokens;
    if (requestId !== undefined) request.request_id = requestId;
    if (speculative !== undefined) request.speculative = speculative;
    const response = await this.generate(request, { timeoutMs });
    if (response.finish_reason !== "FINISH_REASON_STOP") {
      throw new IncompleteOutputError(response);
    }
    return JSON.parse(response.text);
  }

  /** Compile a constraint without generating: { ok, error, compile_s, cached, not_enforced }. */
  validateConstraint(constraint, { timeoutMs } = {}) {
    return this.#unary("ValidateConstraint", { constraint }, timeoutMs);
  }

  /** The model, the server's limits, and its live load. */
  modelInfo({ timeoutMs } = {}) {
    return this.#unary("GetModelInfo", {}, timeoutMs);
  }

  /** The prompt token ids generate() would use: { prompt } or { chat }. */
  tokenize(request, { timeoutMs } = {}) {
    return this.#unary("Tokenize", request, timeoutMs);
  }

  close() {
    this.stub.close();
  }

  #unary(method, request, timeoutMs) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, this.#metadata(request), this.#callOptions(timeoutMs), (error, response) => {
        if (error) {
          reject(fromServiceError(error));
        } else {
          resolve(response);
        }
      });
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
