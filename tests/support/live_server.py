"""A real `formwork serve` in a subprocess on a free loopback port, for live tests.

The server is started with `--port 0` and announces the port it bound ("serving ... on
127.0.0.1:PORT"), so there is no race for a port; the same for the HTTP API (`--http-port 0`,
"serving the OpenAI-compatible API on http://127.0.0.1:PORT/v1"). Its stderr goes to a file that
failures show.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2

from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
_READY = re.compile(r"serving .* on (\S+:\d+)")
_HTTP_READY = re.compile(r"serving the OpenAI-compatible API on (\S+)/v1")

# light engine settings for a 2-core machine
LIGHT_ARGS = ("--max-model-len", "512", "--num-blocks", "256", "--max-tokens-cap", "256", "--threads", "2")
MAX_NUM_SEQS = 16
MAX_QUEUE_LEN = 16  # with MAX_NUM_SEQS: 32 requests in flight at most

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# the person the client tests extract from real sentences: roomier bounds, still bounded so
# extraction finishes in a few tokens
EXTRACT_PERSON_SCHEMA = {**PERSON_SCHEMA, "properties": {"name": {"type": "string", "maxLength": 20},
                                                         "age": {"type": "integer", "minimum": 0, "maximum": 150}}}


class LiveServer:
    def __init__(self, *args: str, startup_timeout_s: float = 300.0) -> None:
        self._stderr = tempfile.NamedTemporaryFile("w+", prefix="formwork-serve-", suffix=".log", delete=False)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
        http = "--no-http" not in args
        http_args = ("--http-port", "0") if http and "--http-port" not in args else ()
        # a data directory of its own (removed at stop), unless the test names one
        self._own_data_dir = tempfile.mkdtemp(prefix="formwork-data-") if "--data-dir" not in args else None
        if self._own_data_dir is not None:
            http_args += ("--data-dir", self._own_data_dir)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", "0", *LIGHT_ARGS,
             *http_args, *args],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        deadline = time.monotonic() + startup_timeout_s
        self.address = self._wait_ready(_READY, deadline)
        # the HTTP API's base URL (http://127.0.0.1:PORT), announced right after gRPC's address
        self.http_url = self._wait_ready(_HTTP_READY, deadline) if http else None
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.GenerationStub(self.channel)

    def _wait_ready(self, ready: re.Pattern, deadline: float) -> str:
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break  # exited
            match = ready.search(line)
            if match:
                return match.group(1)
        self.process.kill()
        raise RuntimeError(f"the server did not become ready:\n{self.log()}")

    def log(self) -> str:
        return Path(self._stderr.name).read_text(errors="replace")[-6000:]

    @property
    def engine_pid(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        for pid in map(int, children):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                return pid
        raise RuntimeError(f"no engine process among the server's children {children}")

    def model_info(self) -> pb.ModelInfo:
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)

    def wait_idle(self, timeout_s: float = 10.0) -> pb.Load:
        """Poll GetModelInfo until nothing runs or waits and every KV block is free again."""
        deadline = time.monotonic() + timeout_s
        while True:
            load = self.model_info().load
            idle = (load.num_running == load.num_waiting == load.num_waiting_for_grammar == load.num_in_flight == 0
                    and load.num_free_kv_blocks == load.num_total_kv_blocks)
            if idle or time.monotonic() > deadline:
                return load
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self._stderr.close()
            if self._own_data_dir is not None:
                shutil.rmtree(self._own_data_dir, ignore_errors=True)


def field_violations(error: grpc.RpcError) -> dict[str, str]:
    """field -> description from the google.rpc.BadRequest in an error's trailer."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            assert status.code == error.code().value[0] and status.message == error.details()
            out = {}
            for detail in status.details:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    out.update({v.field: v.description for v in bad_request.field_violations})
            return out
    return {}


def chat(text: str, **fields) -> pb.GenerateRequest:
    return json_format.ParseDict({"chat": {"messages": [{"role": "user", "content": text}]}, **fields},
                                 pb.GenerateRequest())


def error_of(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)
        if not hasattr(result, "usage"):  # a stream: errors come while iterating
            list(result)
    return info.value
