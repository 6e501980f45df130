"""``shoal serve`` under load: clients polling ``DescribeTrainingJob`` and reading logs
(``DescribeLogStreams`` + ``GetLogEvents``, as SageMaker SDK v2's follower does) while jobs
are submitted and run; every request timed.

    .venv/bin/python benchmarks/serve_load.py [--clients 50] [--jobs 10] [--poll 1.0]

Each client polls every ``--poll`` seconds (SageMaker SDK v2's follower polls its streams every
10 s and the job every 30 s at most; the CLI's waiter every 120 s): a round is one
DescribeTrainingJob, one DescribeLogStreams and one GetLogEvents per stream, from the token
the last round left, as the follower reads.

The clients are threads spread over ``--processes`` processes, each with a kept-alive HTTP
connection (a boto3 client costs milliseconds of CPU a call: on 2 cores fifty of them would
time themselves); jobs are submitted with boto3. A client learns the jobs from
``ListTrainingJobs``. Latency is printed as the clients saw it and as the endpoint's own time
(its ``Server-Timing`` header: from the request's arrival to the answer).

Prints the request count, failures (the goal: none), p50/p99/max latency (the goal: p99 <
50 ms on this machine) and the server process's CPU share over the run (its own CPU time,
children excluded: the jobs' supervisors and ranks are the training, not the endpoint).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import psutil

GROUP = "/aws/sagemaker/TrainingJobs"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.0.1-cpu-py310"
TRAIN = """
import os, time
for i in range(20):
    print(f"{os.environ['SM_CURRENT_HOST']} step {i}", flush=True)
    time.sleep(0.25)
"""


def request(name: str, code: Path, out: Path) -> dict:
    return {
        "TrainingJobName": name, "RoleArn": "arn:aws:iam::111122223333:role/SageMakerRole",
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "HyperParameters": {"sagemaker_program": json.dumps("train.py"),
                            "sagemaker_submit_directory": json.dumps(code.as_uri())},
        "OutputDataConfig": {"S3OutputPath": out.as_uri()},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2,
                           "VolumeSizeInGB": 30},
    }


class Timings:
    def __init__(self):
        self.lock = threading.Lock()
        self.seconds: list[float] = []
        self.server_ms: list[float] = []
        self.failures: list[str] = []

    def call(self, fn, **kwargs):
        start = time.perf_counter()
        try:
            return fn(**kwargs)
        except Exception as error:  # counted, and the run goes on
            with self.lock:
                self.failures.append(f"{fn.__name__}: {error}")
        finally:
            with self.lock:
                self.seconds.append(time.perf_counter() - start)


class Client:
    """One follower's connection (kept alive), speaking JSON 1.1 as any SDK does; no
    signature (loopback). Lighter than a boto3 client, so that on a 2-core machine the
    figures time the endpoint, not the clients' own CPU."""

    def __init__(self, url: str, timings: Timings):
        self.address = urlsplit(url).netloc
        self.connection = http.client.HTTPConnection(self.address, timeout=30)
        self.timings = timings

    def call(self, target: str, body: dict) -> dict | None:
        payload = json.dumps(body).encode()
        headers = {"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"}
        start = time.perf_counter()
        try:
            self.connection.request("POST", "/", payload, headers)
            answer = self.connection.getresponse()
            data = answer.read()
            if answer.status != 200:
                raise RuntimeError(f"{answer.status} {data[:200]!r}")
            timing = answer.getheader("Server-Timing", "")
            return json.loads(data)
        except Exception as error:  # counted, and the run goes on
            self.connection.close()
            self.connection = http.client.HTTPConnection(self.address, timeout=30)
            timing = ""
            with self.timings.lock:
                self.timings.failures.append(f"{target}: {error}")
            return None
        finally:
            elapsed = time.perf_counter() - start
            with self.timings.lock:
                self.timings.seconds.append(elapsed)
                if timing.startswith("app;dur="):
                    self.timings.server_ms.append(float(timing[len("app;dur="):]))


def clients(url: str, count: int, poll: float, stop, results) -> None:
    """One process's clients; its timings and failures go to ``results`` at the end."""
    timings = Timings()
    threads = [threading.Thread(target=client_loop, args=(url, stop, timings, n, poll))
               for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put((timings.seconds, timings.server_ms, timings.failures))


def client_loop(url: str, stop, timings: Timings, n: int, poll: float):
    client = Client(url, timings)
    jitter = random.Random(n)
    stop.wait(jitter.uniform(0, poll))  # followers are not in step with one another
    tokens: dict[str, str] = {}
    known: list[str] = []
    i = n
    while not stop.is_set():
        if i % 20 == n % 20 or not known:  # now and then: which jobs there are
            listed = client.call("SageMaker.ListTrainingJobs", {"MaxResults": 100})
            known = [j["TrainingJobName"] for j in (listed or {}).get("TrainingJobSummaries", [])]
        if not known:
            i += 1
            stop.wait(0.1)
            continue
        job = known[i % len(known)]
        i += 1
        client.call("SageMaker.DescribeTrainingJob", {"TrainingJobName": job})
        streams = client.call("Logs_20140328.DescribeLogStreams", {
            "logGroupName": GROUP, "logStreamNamePrefix": f"{job}/", "orderBy": "LogStreamName",
            "limit": 2})
        for s in (streams or {}).get("logStreams", []):
            name = s["logStreamName"]
            extra = {"nextToken": tokens[name]} if name in tokens else {}
            page = client.call("Logs_20140328.GetLogEvents", {
                "logGroupName": GROUP, "logStreamName": name, "startFromHead": True, **extra})
            if page:
                tokens[name] = page["nextForwardToken"]
        stop.wait(poll * jitter.uniform(0.9, 1.1))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--poll", type=float, default=1.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-serve-load-") as tmp:
        tmp = Path(tmp)
        (tmp / "code").mkdir()
        (tmp / "code" / "train.py").write_text(TRAIN)
        server = subprocess.Popen([sys.executable, "-m", "shoal.cli", "serve", "--port", "0"],
                                  env={**os.environ, "SHOAL_LOCAL_ROOT": str(tmp / "jobs")},
                                  stdout=subprocess.PIPE, text=True)
        url = server.stdout.readline().strip()
        proc = psutil.Process(server.pid)
        timings, jobs = Timings(), []
        context = multiprocessing.get_context("spawn")
        stop, results = context.Event(), context.Queue()
        shares = [args.clients // args.processes + (k < args.clients % args.processes)
                  for k in range(args.processes)]
        workers = [context.Process(target=clients, args=(url, n, args.poll, stop, results))
                   for n in shares if n]
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.monotonic()
        for w in workers:
            w.start()
        sm = boto3.client("sagemaker", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="k", aws_secret_access_key="s")
        for n in range(args.jobs):
            name = f"load-{n}"
            timings.call(sm.create_training_job, **request(name, tmp / "code", tmp / "out"))
            jobs.append(name)
            time.sleep(0.5)
        while any(sm.describe_training_job(TrainingJobName=j)["TrainingJobStatus"] == "InProgress"
                  for j in jobs):
            time.sleep(1)
        stop.set()
        for _ in workers:
            seconds, server_ms, failures = results.get()
            timings.seconds += seconds
            timings.server_ms += server_ms
            timings.failures += failures
        for w in workers:
            w.join()
        cpu, wall = sum(proc.cpu_times()[:2]) - cpu0, time.monotonic() - wall0
        statuses = [sm.describe_training_job(TrainingJobName=j)["TrainingJobStatus"] for j in jobs]
        server.terminate()
        server.wait()
    ms = [s * 1e3 for s in timings.seconds]
    print(f"shoal serve load: {args.clients} clients, {args.jobs} jobs of 2 hosts, "
          f"{os.cpu_count()} cores, {wall:.0f} s")
    print(f"requests {len(ms)} ({len(ms) / wall:.0f}/s), failed {len(timings.failures)}, "
          f"jobs {statuses.count('Completed')}/{len(statuses)} completed")
    print(f"latency ms, as clients saw it: p50 {statistics.median(ms):.1f}, "
          f"p99 {percentile(ms, 0.99):.1f}, max {max(ms):.1f}")
    print(f"latency ms, inside the endpoint: p50 {percentile(timings.server_ms, 0.5):.2f}, "
          f"p99 {percentile(timings.server_ms, 0.99):.2f}, max {max(timings.server_ms):.2f}")
    print(f"server CPU: {100 * cpu / wall:.0f} % of one core ({cpu:.1f} s over {wall:.0f} s)")
    for failure in timings.failures[:5]:
        print("  failure:", failure)
    return 1 if timings.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
