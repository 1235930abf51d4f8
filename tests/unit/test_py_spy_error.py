"""py-spy's error, told in one line: what it printed with RUST_BACKTRACE=1, word for word."""

from gkd_core.node.stacks import py_spy_error

TWO_READERS = """Process 26938: ray::RolloutWorker.sync_rollout_weights
Python v3.11.7 (/usr/bin/python3.11)

Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: EPERM: Operation not permitted
    2: EPERM: Operation not permitted

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
   1: py_spy::python_spy::PythonSpy::get_stack_traces
   2: py_spy::dump::write_traces
   3: py_spy::dump::print_traces
   4: py_spy::run_spy_command
   5: py_spy::main
   6: std::sys::backtrace::__rust_begin_short_backtrace
   7: std::rt::lang_start::{{closure}}
   8: std::rt::lang_start_internal
   9: main
"""

NOT_PYTHON = """Error: Failed to find python version from target process

Stack backtrace:
   0: anyhow::error::<impl anyhow::Error>::msg
  10: main
"""


def test_the_error_and_its_causes_not_the_backtrace():
    assert py_spy_error(TWO_READERS) == ("Failed to get stack traces: Failed to suspend process: "
                                         "EPERM: Operation not permitted")
    assert py_spy_error(NOT_PYTHON) == "Failed to find python version from target process"


def test_without_an_error_line_the_last_line_and_nothing_from_nothing():
    assert py_spy_error("something odd\nexit early\n") == "exit early"
    assert py_spy_error("") == ""
