"""Python tracebacks read out of a rank's output: the exception that heads a failure, and
whether the rank failed only because another did."""

from shoal.launcher import tracebacks

TRACEBACK = ("Traceback (most recent call last):", '  File "train.py", line 5, in <module>',
             '    raise ValueError("boom")', "ValueError: boom")  # fmt: skip


def test_exception_line_of_chained_and_scrolled_tracebacks():
    chained = (*TRACEBACK, "", "During handling of the above exception, another exception occurred:",
               "", "Traceback (most recent call last):", '  File "t.py", line 9, in <module>',
               "    f()", "mypkg.errors.StepFailure: step 4", "done")
    assert tracebacks.exception_line(chained) == "mypkg.errors.StepFailure: step 4"
    scrolled = ['  File "t.py", line 9, in <module>', "    f()", "log line", "KeyError: 'x'"]
    assert tracebacks.exception_line(scrolled) == "KeyError: 'x'"
    assert tracebacks.exception_line(["no traceback", "ValueError: looks like one"]) is None
    assert tracebacks.exception_line(["Traceback (most recent call last):", "  File", "Custom"]) == (
        "Custom")


def test_exception_line_of_a_traceback_torch_prefixed_with_the_rank():
    # torch.distributed's excepthook writes every line of the traceback as "[rankN]: ...".
    prefixed = ("[rank2]: Traceback (most recent call last):",
                '[rank2]:   File "train.py", line 9, in <module>', "[rank2]:     main()",
                "[rank2]: ValueError: Batch size must be divisible", "terminate called")
    assert tracebacks.exception_line(prefixed) == "ValueError: Batch size must be divisible"


def test_a_rank_that_raised_a_peers_failure_relays_it():
    lost = ("[rank1]: Traceback (most recent call last):", '[rank1]:   File "t.py", line 3',
            "[rank1]: shoal.errors.PeerLostError: allreduce: rank 0 (pid 7) exited")
    assert tracebacks.relays_a_failure(lost)
    relayed = (*TRACEBACK[:3], "shoal.modelparallel.errors.SMPPeerError: module '[1:3]' failed "
               "on pipeline rank 1:", "Traceback (most recent call last):", "ValueError: bad")
    assert tracebacks.relays_a_failure(relayed)
    assert tracebacks.relays_a_failure(("SMPPeerError",))


def test_a_rank_with_its_own_error_relays_nothing():
    assert not tracebacks.relays_a_failure(TRACEBACK)
    # the name inside a message, or a lookalike class, is no relay
    assert not tracebacks.relays_a_failure(("ValueError: a PeerLostError was seen",
                                            "MyPeerLostErrorHandler: x", "    PeerLostError: x"))
