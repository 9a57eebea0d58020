"""FastAPI routes of the reward service, thin: parse, call RewardHttpHandler, render. Plus the embedded uvicorn.

Served next to gRPC in one process (`cooper serve reward`), on the same event loop and the same batcher, so HTTP
and gRPC requests share model batches. `create_app(config)` alone (no service passed) builds the service in the
lifespan, for running the HTTP API by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cooper.config import RewardConfig
from cooper.services.reward.service import RewardService
from cooper.services.reward.serving import protocol
from cooper.services.reward.serving.handler import ApiError, RewardHttpHandler

log = logging.getLogger("cooper.reward")

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": protocol.ErrorResponse, "description": text}
    for status, text in [(401, "missing or wrong bearer token"), (413, "too many items, text or body too long"),
                         (422, "malformed body"),
                         (503, "queue full or timed out, or a stale replica (reward.replica.on_stale=refuse); "
                               "see Retry-After")]
}

CLASSIFY_PATHS = ("/classify", "/v1/classify")  # vLLM serves the first, SGLang the second
CLASSIFY_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": protocol.ClassificationErrorResponse, "description": text}
    for status, text in [(400, "malformed body, an input that is not the VerifyRM template text, or `normalize`"),
                         (401, "missing or wrong bearer token"), (413, "too many inputs, text or body too long"),
                         (503, ERRORS[503]["description"]),
                         ("4XX", "every refusal, in vLLM's error body (no 422: FastAPI's default, which these routes "
                                 "never answer)")]
}

bearer = HTTPBearer(auto_error=False, description="reward.http.token, when one is configured")


def _error_response(err: ApiError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(err.retry_after_s)
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(err.body().model_dump(), status_code=err.status, headers=headers)


def _classify_error_response(err: ApiError, headers: Mapping[str, str] | None = None, type: str | None = None,
                             param: str | None = None) -> JSONResponse:
    """`err` as vLLM's server answers it: an invalid request is 400 (ours are 422 elsewhere), the body vLLM's."""
    status = 400 if err.status == 422 else err.status
    type = type or ("BadRequestError" if status == 400 else HTTPStatus(status).phrase)
    body = protocol.ClassificationErrorResponse(error=protocol.ClassificationErrorDetail(
        message=err.message, type=type, param=param, code=status))
    response = _error_response(err, headers)  # its headers: Retry-After, WWW-Authenticate
    return JSONResponse(body.model_dump(), status_code=status, headers={
        name: value for name, value in response.headers.items() if name in ("retry-after", "www-authenticate")})


# Pydantic's names for the branches of a type in an error's location ("input", "str"), which vLLM drops from `param`
_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none", "union", "tagged-union", "nullable", "default",
             "chain", "lax-or-strict", "json-or-python", "function-after", "function-before", "function-wrap"}


def _param(loc: Sequence[int | str]) -> str | None:
    """The `param` vLLM names for an error at `loc`: "body.input", not "body.input.str"."""
    return ".".join(str(p) for p in loc if str(p) not in _BRANCHES and "[" not in str(p)) or None


class ClassifyRoute(APIRoute):
    """A route that refuses as vLLM's server does (400, vLLM's error body), for /classify: vLLM's clients read its
    errors. Catching here, around the route, keeps the app's exception handlers one table for every other route."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        route_handler = super().get_route_handler()

        async def refusing_as_vllm(request: Request) -> Response:
            try:
                return await route_handler(request)
            except RequestValidationError as err:
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5])
                first = err.errors()[0]["loc"] if err.errors() else ()
                return _classify_error_response(ApiError(400, "invalid_request", f"malformed request: {problems}"),
                                                type="Bad Request", param=_param(first))
            except ApiError as err:
                return _classify_error_response(err)
            except StarletteHTTPException as err:  # a body FastAPI cannot decode
                return _classify_error_response(ApiError(err.status_code, "invalid_request", str(err.detail)),
                                                err.headers, type=HTTPStatus(err.status_code).phrase)

        return refusing_as_vllm


class BodyLimit:
    """Pure ASGI middleware: 413 when Content-Length exceeds the limit, before the body is read."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                    err = ApiError(413, "too_large", f"request body of {int(value)} bytes; at most {self.max_bytes} "
                                   "(reward.http.max_body_mb)")
                    await _refusal_response(scope["path"], err)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _refusal_response(path: str, err: ApiError) -> JSONResponse:
    """`err` in the error body of the route at `path`: vLLM's on /classify, ours everywhere else."""
    return _classify_error_response(err) if path in CLASSIFY_PATHS else _error_response(err)


def _internal_error_response(err: Exception) -> JSONResponse:
    """The answer to an error nothing expected: a 500 in the service's error body, on every route."""
    return _error_response(ApiError(500, "internal", f"{type(err).__name__}: {err}"))


class ScoringFastPath:
    """What uvicorn runs in front of the FastAPI app: the scoring routes' well-formed requests answered without
    FastAPI's middleware stack, routing, dependency solving and response re-validation. The body is parsed by
    pydantic-core from its raw bytes and the answer is the response model's own JSON: the same request model,
    handler method and response model as the FastAPI route, so the same answer (tests/reward/test_http.py sends
    every request both ways and compares).

    Everything else goes on to the FastAPI app untouched, its body replayed: another route or method, a body that
    does not validate, a content type other than JSON, a chunked body, a body over reward.http.max_body_mb, a missing
    or wrong token. So every refusal of a request's shape, size or credentials still comes from the app's one table;
    the refusals of the handler itself (limits, a full queue) are rendered by the functions the routes use.

    Why: with 32 clients of one item each on 2 cores, FastAPI's path through routing, `Depends`, body validation and
    `response_model` cost 265 us of CPU per request, as much as tokenizing the item, in the process that also feeds
    the model (bench/reward_http.py); this path costs about a fifth of that. Why outside the app rather than one of
    its middlewares: FastAPI's own stack (error and telemetry middlewares, which read the environment on every
    request, and their wrappers of `send`) took another 8% of the serving process's Python time. What is left out
    for these requests is FastAPI's exception telemetry: an unexpected error is logged and answered 500 here."""

    def __init__(self, app: FastAPI):
        self.app = app
        self.routes: dict[str, tuple[type[BaseModel], Callable[..., Awaitable[BaseModel]]]] = {
            "/v1/score": (protocol.ScoreRequest, RewardHttpHandler.score),
            "/get_reward": (protocol.OpenRLHFRequest, RewardHttpHandler.get_reward),
            **{path: (protocol.ClassificationRequest, RewardHttpHandler.classify) for path in CLASSIFY_PATHS},
        }

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        length = content_type = authorization = None
        if route is not None:
            for name, value in scope["headers"]:
                if name == b"content-length":
                    length = value
                elif name == b"content-type":
                    content_type = value
                elif name == b"authorization":
                    authorization = value
        api: RewardHttpHandler | None = getattr(self.app.state, "handler", None)  # None until the lifespan starts
        within_limit = api is not None and length is not None and length.isdigit() \
            and int(length) <= api.config.max_body_bytes  # over it: the app's BodyLimit refuses
        json_body = content_type is None or content_type.split(b";")[0].strip().lower() == b"application/json"
        if route is None or api is None or not within_limit or not json_body:
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive)
        if not complete:
            return  # the client went away
        request_model, method = route
        try:
            api.authorize(_bearer(authorization))
            parsed = request_model.model_validate_json(body)
        except (ApiError, ValidationError):
            await self.app(scope, _replaying(body, receive), send)  # FastAPI refuses it, in its one way
            return
        headers = api.stale_headers()
        try:
            answer = await method(api, parsed)
        except ApiError as err:
            await _refusal_response(scope["path"], err)(scope, receive, send)
            return
        except Exception as err:  # the app's handler of the unexpected, as FastAPI would call it; logged as uvicorn does
            log.exception("reward HTTP: unexpected error answering POST %s", scope["path"])
            await _internal_error_response(err)(scope, receive, send)
            return
        payload = answer.model_dump_json().encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(payload)).encode()), (b"content-type", b"application/json"),
            *((name.lower().encode(), value.encode()) for name, value in headers.items())]})
        await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Any) -> tuple[bytes, bool]:
    """The whole body, and False if the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replaying(body: bytes, receive: Any) -> Any:
    """A receive that gives `body` first, then whatever the client sends next (a disconnect)."""
    replayed = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _bearer(authorization: bytes | None) -> str | None:
    """The token of an 'Authorization: Bearer <token>' header, as FastAPI's HTTPBearer(auto_error=False) reads it."""
    scheme, credentials = get_authorization_scheme_param(authorization.decode("latin-1") if authorization else None)
    return credentials if scheme.lower() == "bearer" and credentials else None


def handler(request: Request) -> RewardHttpHandler:
    return request.app.state.handler


async def authorized(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> RewardHttpHandler:
    # async on purpose: FastAPI runs a plain-def dependency on a worker thread, a thread hop per request.
    api = handler(request)
    api.authorize(credentials.credentials if credentials else None)
    return api


Authorized = Annotated[RewardHttpHandler, Depends(authorized)]


def create_app(config: RewardConfig, service: RewardService | None = None) -> FastAPI:
    """The HTTP API over `service`, or over a service the lifespan builds (and stops) when none is given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = service is None
        core = service if service is not None else await RewardService.create(config)
        app.state.handler = RewardHttpHandler(core, config.http)
        try:
            yield
        finally:
            if owned:
                await core.stop()

    app = FastAPI(
        title="Cooper reward service",
        description="VerifyRM scores with the model version that produced them. Same batcher as the gRPC API.",
        version="1", lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, max_bytes=config.http.max_body_bytes)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return _error_response(err)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5])
        return _error_response(ApiError(422, "invalid_request", f"malformed request: {problems}"))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        return _internal_error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 400:
            # FastAPI's answer to a body it cannot decode (not UTF-8, not JSON of the declared shape): malformed
            # like any other bad body, so one status for all of them, the one the spec documents.
            return _error_response(ApiError(422, "invalid_request", f"malformed request: {err.detail}"))
        kind = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        # err.headers carries Allow on a 405 (RFC 9110 requires it)
        return _error_response(ApiError(err.status_code, kind, str(err.detail)), err.headers)

    @app.post("/v1/score", response_model=protocol.ScoreResponse, responses=ERRORS)
    async def score(body: protocol.ScoreRequest, api: Authorized, response: Response) -> Any:
        """Score items; every score in the answer came from model `version`."""
        response.headers.update(api.stale_headers())
        return await api.score(body)

    @app.post("/v1/learn", response_model=protocol.LearnResponse, responses={
        **ERRORS, 409: {"model": protocol.ErrorResponse, "description": "learning is off (reward.learn_online)"}})
    async def learn(api: Authorized) -> Any:
        """A learning step (reward.learn_online): VerifyRM learns from the completions scored since the last one,
        checked by the rule verifier against their references; the next scores come from the new version."""
        return await api.learn()

    @app.get("/v1/model", response_model=protocol.ModelResponse, responses=ERRORS)
    async def model(api: Authorized) -> Any:
        """The model, its current version and latest checkpoint."""
        return api.model_info()

    @app.post("/get_reward", response_model=protocol.OpenRLHFResponse, responses=ERRORS)
    async def get_reward(body: protocol.OpenRLHFRequest, api: Authorized, response: Response) -> Any:
        """OpenRLHF's remote reward model protocol (`--remote_rm_url http://host:port/get_reward`)."""
        response.headers.update(api.stale_headers())
        return await api.get_reward(body)

    async def classify(body: protocol.ClassificationRequest, api: Authorized, response: Response) -> Any:
        """vLLM's classification API (clients of vLLM or SGLang, verl's reward loop); each input is the VerifyRM
        template text of a (question, reference, completion) triple."""
        response.headers.update(api.stale_headers())
        return await api.classify(body)

    for path in CLASSIFY_PATHS:  # on the app's own router (an included router is opaque in app.routes)
        app.router.add_api_route(path, classify, methods=["POST"], response_model=protocol.ClassificationResponse,
                                 responses=CLASSIFY_ERRORS, operation_id=f"classify{path.replace('/', '_')}",
                                 route_class_override=ClassifyRoute)

    @app.get("/healthz", response_model=protocol.StatusResponse, responses={503: ERRORS[503]})
    async def healthz(request: Request) -> Any:
        """Liveness: the process answers."""
        return handler(request).health()

    @app.get("/readyz", response_model=protocol.StatusResponse, responses=ERRORS)
    async def readyz(request: Request) -> Any:
        """Readiness: the model is loaded and the batcher runs (503 while starting or draining, or while a replica
        is stale with reward.replica.on_stale=refuse)."""
        return handler(request).readiness()

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format"}})
    async def metrics(request: Request) -> Response:
        """Prometheus metrics of the whole process (HTTP, gRPC, batcher, model)."""
        body, content_type = handler(request).metrics()
        return Response(body, media_type=content_type)

    if config.http.token is None:
        app.openapi = lambda: _without_auth(FastAPI.openapi(app))  # type: ignore[method-assign]
    return app


def _without_auth(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec of an open API (no reward.http.token): no bearer scheme and no 401, which it never answers."""
    spec.get("components", {}).pop("securitySchemes", None)
    for operations in spec["paths"].values():
        for operation in operations.values():
            operation.pop("security", None)
            operation.get("responses", {}).pop("401", None)
    return spec


class CoalescingTransport:
    """Writes made in one event-loop iteration go out in one transport.write: uvicorn writes a response's head and
    its body apart, two send(2) calls and two TCP segments that wake the client twice. With 32 clients of single
    items, those writes were a sixth of the serving process's CPU. Bytes and their order are unchanged."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._transport, name)


class _CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol (what uvicorn picks when httptools is installed, as it is here) writing through a
    CoalescingTransport."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside someone else's event loop: the GrpcService owns SIGTERM, so uvicorn must not take it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        pass


@dataclass
class HttpServer:
    server: _EmbeddedUvicorn
    task: asyncio.Task[None]
    port: int
    app: FastAPI  # create_app's, behind the ScoringFastPath that uvicorn runs

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish, run the app's lifespan shutdown."""
        self.server.should_exit = True
        await self.task


async def start_http(app: FastAPI, host: str, port: int) -> HttpServer:
    """Start uvicorn on the running event loop, serving `app` (create_app's) behind the scoring fast path; returns
    once it accepts connections (port 0 picks a free one)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"reward HTTP: cannot bind {host}:{port} ({err.strerror}); set reward.http.port") from None
    config = uvicorn.Config(ScoringFastPath(app), http=_CoalescingHttpTools, log_config=None, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=10)
    server = _EmbeddedUvicorn(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="reward-http")
    while not server.started:
        if task.done():
            task.result()  # raises the start-up error
            raise RuntimeError("reward HTTP server exited during start-up")
        await asyncio.sleep(0.01)
    return HttpServer(server, task, sock.getsockname()[1], app)
