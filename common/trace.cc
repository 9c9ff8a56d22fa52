#include "common/trace.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace rdmaflow::trace {

namespace detail {
bool g_enabled = false;
}  // namespace detail

namespace {

constexpr int64_t kDefaultEvents = int64_t{1} << 18;
constexpr int64_t kMaxEvents = int64_t{1} << 26;  // 10 GiB: beyond that a typo, not a wish

// One finished span, fixed size so the ring's memory is known up front.
// Plain data without initializers: the ring is allocated, not constructed, so
// pages an idle tracer never fills are never touched.
struct Event {
  const char* cat;
  const char* label_key;
  int64_t start_ns;
  int64_t dur_ns;
  int64_t bytes;
  int64_t step;
  int64_t peers;
  uint64_t id;  // async operations: their b/e pair's id; 0: a complete event
  int32_t peer;
  uint32_t tid;
  char name[48];
  char label[40];
};
static_assert(sizeof(Event) == 160, "docs/configuration.md gives RDMAFLOW_TRACE_EVENTS' cost");

void copy_text(char* dst, size_t cap, std::string_view s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// Bumped in a forked child, whose threads' cached ids and names are stale.
std::atomic<int> g_generation{0};

uint32_t thread_id() {
  thread_local int generation = -1;
  thread_local uint32_t tid = 0;
  if (generation != g_generation.load(std::memory_order_relaxed)) {
    generation = g_generation.load(std::memory_order_relaxed);
    tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  }
  return tid;
}

class Tracer {
 public:
  // Null (tracing off) when RDMAFLOW_TRACE is unset or unusable; the reason
  // goes to stderr, naming the path, since logging may not exist yet.
  static Tracer* create() {
    const char* dir = std::getenv("RDMAFLOW_TRACE");
    if (dir == nullptr || *dir == '\0') return nullptr;
    const int64_t cap = events_knob();
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      warn(std::string("RDMAFLOW_TRACE=") + dir + ": cannot create the directory (" + ec.message() +
           "); tracing is off");
      return nullptr;
    }
    if (::access(dir, W_OK | X_OK) != 0) {
      warn(std::string("RDMAFLOW_TRACE=") + dir + ": the directory is not writable (" +
           std::strerror(errno) + "); tracing is off");
      return nullptr;
    }
    auto* t = new Tracer(dir, static_cast<size_t>(cap));
    if (t->ring_ == nullptr) {
      warn("RDMAFLOW_TRACE_EVENTS=" + std::to_string(cap) + ": cannot allocate the buffer (" +
           std::to_string(cap * static_cast<int64_t>(sizeof(Event))) + " bytes); tracing is off");
      delete t;
      return nullptr;
    }
    return t;
  }

  void add(const Event& e) {
    const uint32_t tid = e.tid;
    thread_local int named = -1;  // the generation this thread's name was taken in
    std::lock_guard<std::mutex> lock(mu_);
    if (named != g_generation.load(std::memory_order_relaxed)) {
      named = g_generation.load(std::memory_order_relaxed);
      char buf[32] = {};
      if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) buf[0] = '\0';
      threads_[tid] = buf;
    }
    ring_[total_ % cap_] = e;
    ++total_;
  }

  uint64_t next_id() { return ids_.fetch_add(1, std::memory_order_relaxed) + 1; }

  void set_rank(int rank, int world) {
    std::lock_guard<std::mutex> lock(mu_);
    rank_ = rank;
    world_ = world;
  }
  void set_offset(int64_t offset, int64_t rtt) {
    std::lock_guard<std::mutex> lock(mu_);
    offset_ns_ = offset;
    rtt_ns_ = rtt;
  }

  std::string path() {
    std::lock_guard<std::mutex> lock(mu_);
    return path_locked();
  }

  void flush();

  // fork() without exec (test harnesses, launchers): the child starts an empty
  // trace of its own, and never inherits a lock some other thread held.
  void before_fork() {
    flush_mu_.lock();
    mu_.lock();
  }
  void after_fork_in_parent() {
    mu_.unlock();
    flush_mu_.unlock();
  }
  void after_fork_in_child() {
    g_generation.fetch_add(1);
    total_ = 0;
    threads_.clear();
    rank_ = -1;
    written_.clear();
    mu_.unlock();
    flush_mu_.unlock();
  }

 private:
  Tracer(std::string dir, size_t cap)
      : dir_(std::move(dir)), cap_(cap), ring_(new (std::nothrow) Event[cap]) {}

  static void warn(const std::string& what) {
    std::fprintf(stderr, "rdmaflow: %s\n", what.c_str());
  }

  static int64_t events_knob() {
    const char* v = std::getenv("RDMAFLOW_TRACE_EVENTS");
    if (v == nullptr || *v == '\0') return kDefaultEvents;
    int64_t n = 0;
    const char* end = v + std::strlen(v);
    auto [ptr, err] = std::from_chars(v, end, n);
    if (err != std::errc() || ptr != end || n < 1 || n > kMaxEvents) {
      warn(std::string("RDMAFLOW_TRACE_EVENTS='") + v + "' is not an integer in [1, " +
           std::to_string(kMaxEvents) + "]; using " + std::to_string(kDefaultEvents));
      return kDefaultEvents;
    }
    return n;
  }

  std::string path_locked() const {
    const std::string who =
        rank_ >= 0 ? "rank" + std::to_string(rank_) + "-pid" : std::string("pid");
    return dir_ + "/rdmaflow-trace-" + who + std::to_string(::getpid()) + ".json";
  }

  const std::string dir_;
  const size_t cap_;
  std::unique_ptr<Event[]> ring_;
  std::atomic<uint64_t> ids_{0};
  std::mutex flush_mu_;  // one flush at a time (exit and an error path may meet)
  std::mutex mu_;
  uint64_t total_ = 0;                       // events ever added; the ring holds the last cap_
  std::map<uint32_t, std::string> threads_;  // tid -> name, for the viewer's rows
  int rank_ = -1;
  int world_ = 0;
  int64_t offset_ns_ = 0;
  int64_t rtt_ns_ = -1;
  std::string written_;  // the last file written (flush() only)
};

Tracer* const g_tracer = [] {
  Tracer* t = Tracer::create();
  if (t != nullptr) {
    detail::g_enabled = true;
    std::atexit([] { g_tracer->flush(); });
    pthread_atfork([] { g_tracer->before_fork(); }, [] { g_tracer->after_fork_in_parent(); },
                   [] { g_tracer->after_fork_in_child(); });
  }
  return t;
}();

std::string json_text(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string args_json(const Event& e) {
  std::string s;
  auto field = [&](const char* key, const std::string& value) {
    s += s.empty() ? "{" : ",";
    s += std::string("\"") + key + "\":" + value;
  };
  if (e.peer >= 0) field("peer", std::to_string(e.peer));
  if (e.bytes >= 0) field("bytes", std::to_string(e.bytes));
  if (e.step >= 0) field("step", std::to_string(e.step));
  if (e.peers >= 0) field("peers", std::to_string(e.peers));
  if (e.label_key != nullptr) field(e.label_key, json_text(e.label));
  return s.empty() ? "{}" : s + "}";
}

void Tracer::flush() {
  std::lock_guard<std::mutex> one_writer(flush_mu_);
  std::vector<Event> events;
  std::map<uint32_t, std::string> threads;
  uint64_t total = 0;
  int rank = 0;
  int world = 0;
  int64_t offset = 0;
  int64_t rtt = 0;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    total = total_;
    const uint64_t kept = std::min<uint64_t>(total_, cap_);
    events.reserve(kept);
    for (uint64_t i = total_ - kept; i < total_; ++i) events.push_back(ring_[i % cap_]);
    threads = threads_;
    rank = rank_;
    world = world_;
    offset = offset_ns_;
    rtt = rtt_ns_;
    path = path_locked();
  }
  // A process that never joined a job and traced nothing (a launcher) leaves no file.
  if (rank < 0 && events.empty()) return;
  // By start, the enclosing span first on a tie: what viewers need to nest
  // complete events (a span is recorded when it ends, so inner ones come first).
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.dur_ns > b.dur_ns;
  });
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    warn("cannot write the trace " + tmp + ": " + std::strerror(errno));
    return;
  }
  const int pid = rank >= 0 ? rank : static_cast<int>(::getpid());
  auto us = [&](int64_t ns) { return static_cast<double>(ns + offset) / 1000.0; };
  const uint64_t dropped = total - events.size();
  std::fprintf(f,
               "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"rank\":%d,\"world\":%d,"
               "\"os_pid\":%d,\"clock_offset_ns\":%lld,\"clock_rtt_ns\":%lld,"
               "\"buffer_events\":%zu,\"events_recorded\":%llu,\"events_dropped\":%llu},\n"
               "\"traceEvents\":[\n",
               rank, world, static_cast<int>(::getpid()), static_cast<long long>(offset),
               static_cast<long long>(rtt), cap_, static_cast<unsigned long long>(total),
               static_cast<unsigned long long>(dropped));
  const std::string process =
      rank >= 0 ? "rank " + std::to_string(rank) : "pid " + std::to_string(pid);
  std::fprintf(f,
               "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":%s}}",
               pid, json_text(process).c_str());
  for (const auto& [tid, name] : threads) {
    std::fprintf(f,
                 ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%u,"
                 "\"args\":{\"name\":%s}}",
                 pid, tid,
                 json_text(name.empty() ? "thread " + std::to_string(tid) : name).c_str());
  }
  for (const Event& e : events) {
    const std::string name = json_text(e.name);
    const std::string args = args_json(e);
    if (e.id == 0) {
      std::fprintf(f,
                   ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":%s,\"pid\":%d,\"tid\":%u,"
                   "\"ts\":%.3f,\"dur\":%.3f,\"args\":%s}",
                   e.cat, name.c_str(), pid, e.tid, us(e.start_ns),
                   static_cast<double>(e.dur_ns) / 1000.0, args.c_str());
    } else {
      std::fprintf(f,
                   ",\n{\"ph\":\"b\",\"cat\":\"%s\",\"name\":%s,\"id\":\"0x%llx\",\"pid\":%d,"
                   "\"tid\":%u,\"ts\":%.3f,\"args\":%s}",
                   e.cat, name.c_str(), static_cast<unsigned long long>(e.id), pid, e.tid,
                   us(e.start_ns), args.c_str());
      std::fprintf(f,
                   ",\n{\"ph\":\"e\",\"cat\":\"%s\",\"name\":%s,\"id\":\"0x%llx\",\"pid\":%d,"
                   "\"tid\":%u,\"ts\":%.3f}",
                   e.cat, name.c_str(), static_cast<unsigned long long>(e.id), pid, e.tid,
                   us(e.start_ns + e.dur_ns));
    }
  }
  std::fprintf(f, "\n]}\n");
  const bool ok = std::ferror(f) == 0;
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    warn("cannot write the trace " + path + ": " + std::strerror(errno));
    std::remove(tmp.c_str());
    return;
  }
  // An error flushed before bootstrap knew the rank wrote under the pid alone.
  std::lock_guard<std::mutex> lock(mu_);
  if (!written_.empty() && written_ != path) std::remove(written_.c_str());
  written_ = path;
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

void fill(Event& e, const char* cat, std::string_view name, const Args& args) {
  e.cat = cat;
  e.label_key = args.label_key;
  e.bytes = args.bytes;
  e.step = args.step;
  e.peers = args.peers;
  e.id = 0;
  e.peer = args.peer;
  e.tid = thread_id();
  copy_text(e.name, sizeof(e.name), name);
  copy_text(e.label, sizeof(e.label), args.label);
}

// This thread's open spans, innermost last. Scoped spans end in reverse order
// of their start, so a stack of slots stands in for an allocation per span.
// Allocated on a thread's first span: nothing per thread with tracing off.
struct OpenSpans {
  static constexpr int kMaxDepth = 64;  // deeper spans are left out
  Event slots[kMaxDepth];
  int depth = 0;
};

OpenSpans& open_spans() {
  thread_local std::unique_ptr<OpenSpans> spans;
  if (!spans) spans = std::make_unique<OpenSpans>();
  return *spans;
}

}  // namespace

void record(const char* cat, std::string_view name, int64_t start_ns, int64_t end_ns,
            const Args& args, bool async) {
  if (!enabled()) return;
  Event e;
  fill(e, cat, name, args);
  e.start_ns = start_ns;
  e.dur_ns = std::max<int64_t>(0, end_ns - start_ns);
  if (async) e.id = g_tracer->next_id();
  g_tracer->add(e);
}

void Span::begin(const char* cat, std::string_view name, const Args& args) {
  OpenSpans& spans = open_spans();
  if (spans.depth == OpenSpans::kMaxDepth) return;
  Event& e = spans.slots[spans.depth++];
  fill(e, cat, name, args);
  e.start_ns = now_ns();
  open_ = &e;
}

void Span::end() {
  Event& e = *static_cast<Event*>(open_);
  e.dur_ns = std::max<int64_t>(0, now_ns() - e.start_ns);
  g_tracer->add(e);
  OpenSpans& spans = open_spans();
  spans.depth = static_cast<int>(&e - spans.slots);  // pops it
  open_ = nullptr;
}

void set_rank(int rank, int world) {
  if (enabled()) g_tracer->set_rank(rank, world);
}

void set_clock_offset(int64_t offset_ns, int64_t rtt_ns) {
  if (enabled()) g_tracer->set_offset(offset_ns, rtt_ns);
}

void flush() {
  if (enabled()) g_tracer->flush();
}

void flush_on_error() {
  if (!enabled()) return;
  static std::atomic<int64_t> last{INT64_MIN};
  const int64_t now = now_ns();
  int64_t seen = last.load(std::memory_order_relaxed);
  if (seen != INT64_MIN && now - seen < 1'000'000'000) return;
  if (!last.compare_exchange_strong(seen, now)) return;  // another thread flushes
  g_tracer->flush();
}

std::string file_path() {
  return enabled() ? g_tracer->path() : std::string();
}

}  // namespace rdmaflow::trace
