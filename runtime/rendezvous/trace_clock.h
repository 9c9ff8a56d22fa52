// Aligns this rank's trace clock with rank 0's (common/trace.h), so that the
// ranks' trace files line up when merged. Called by Bootstrap::create() when
// RDMAFLOW_TRACE is set, on every rank: RDMAFLOW_TRACE must be set for all of
// them (a rank without it leaves the others waiting up to a few seconds, then
// they keep their own clock and say so).
//
// NTP's idea over the rendezvous store: rank r stamps t0, posts a ping, rank 0
// answers with its clock T, r stamps t3 on the answer; offset = T - (t0+t3)/2,
// taken from the round trip with the smallest t3 - t0 (the least queueing;
// the error is at most half that round trip, recorded in the file). Rank 0
// answers the ranks one after another, so this costs about
// world * kRounds store round trips, only when tracing.
#pragma once

#include "common/status.h"
#include "runtime/rendezvous/store.h"

namespace rdmaflow {

// Tells the tracer this process's rank and world, then measures and sets the
// clock offset. Failures are logged, never returned: a trace must not break a job.
void align_trace_clock(Store& store, int rank, int world);

}  // namespace rdmaflow
