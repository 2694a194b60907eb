// Running one engine call so that Python stays responsive: Ctrl-C stops it and an
// optional progress callback follows it, without splitting it into several calls.
//
// The engine (loo_reduce, loo_grad, loo_reduce_multi) runs on a worker std::thread with
// a kdecal::Control; the calling thread waits for it with the GIL released and wakes
// every kPollInterval to take the GIL, run Python's signal handlers (PyErr_CheckSignals:
// Ctrl-C raises KeyboardInterrupt there) and call progress(rows_done).  On an error
// (KeyboardInterrupt, or an exception from the callback) it sets control.cancel, which
// the engine's threads test before every row block, joins the worker and lets the error
// propagate.  No thread outlives the call: every path out of run_watched joins the
// worker.  The engine computes exactly what it computes without a watcher (same rows,
// same order), so results are bitwise the same.
#pragma once

#include "pybind11.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "kdecal/loo.hpp"

namespace kdecal_bind {

/// Work (about the number of kernel evaluations, see each binding) below which a call
/// runs on the calling thread, unwatched: it ends within about 0.1 s even on one thread,
/// and a new thread (with its own OpenMP team) per call would cost a noticeable part of
/// a short call on many cores.  Exposed to Python as _core.WATCH_MIN_WORK.
constexpr double kWatchMinWork = 1e8;

/// Time between two looks at signals and progress.
constexpr std::chrono::milliseconds kPollInterval{50};

/// Run work(kdecal::Control*) and return when it is done.  `work` makes the engine calls
/// of one binding and must not touch Python (it runs without the GIL, possibly on
/// another thread); exceptions it throws are re-thrown here.  Must be called with the
/// GIL held.  progress: None, or a callable taking the number of rows done so far; it is
/// called with strictly increasing counts, the last one the final count.  Raises
/// whatever PyErr_CheckSignals or the callback raise, after stopping the engine.
template <class Work>
void run_watched(Work&& work, const py::object& progress, double work_size) {
    kdecal::Control control;
    std::int64_t reported = 0;
    auto report = [&]() {
        if (progress.is_none()) return;
        const std::int64_t done = control.rows_done.load(std::memory_order_relaxed);
        if (done <= reported) return;
        reported = done;
        progress(done);
    };
    auto run_here = [&]() {
        {
            py::gil_scoped_release release;
            work(&control);
        }
        report();
    };
    if (work_size < kWatchMinWork) return run_here();

    struct Shared {
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;
        std::exception_ptr error;
    } shared;
    std::thread worker;
    try {
        worker = std::thread([&shared, &work, &control]() {
            try {
                work(&control);
            } catch (...) {
                shared.error = std::current_exception();
            }
            std::lock_guard<std::mutex> lock(shared.mu);
            shared.done = true;
            shared.cv.notify_all();
        });
    } catch (const std::system_error&) {  // no thread to be had: run unwatched
        return run_here();
    }
    // Stops and joins the worker on every way out of this function, exceptions
    // included.  The GIL is held on all of them (a gil_scoped_release below has
    // re-acquired it before its scope is left), so it can be released for the join.
    struct Joiner {
        std::thread& worker;
        kdecal::Control& control;
        ~Joiner() {
            if (!worker.joinable()) return;
            control.cancel.store(true, std::memory_order_relaxed);
            py::gil_scoped_release release;
            worker.join();
        }
    } joiner{worker, control};

    for (;;) {
        bool finished;
        {
            py::gil_scoped_release release;
            std::unique_lock<std::mutex> lock(shared.mu);
            finished = shared.cv.wait_for(lock, kPollInterval, [&shared] { return shared.done; });
        }
        if (finished) break;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // e.g. Ctrl-C
        report();
    }
    {
        py::gil_scoped_release release;
        worker.join();
    }
    if (shared.error) std::rethrow_exception(shared.error);
    report();
}

}  // namespace kdecal_bind
