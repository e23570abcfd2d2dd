// ThreadSanitizer's view of Debian's prebuilt gRPC completion queues.
//
// Linked into every executable of a DECISION_SANITIZE=thread build, next to absl_tsan.cc.
//
// Why: gRPC's contract is that whatever a thread did before it started a batch of
// operations with a tag happens before the code that receives that tag's completion. The
// callback API (our server's reactors) relies on it: StartWrite/Finish arm a tag in one
// thread and OnWriteDone/OnDone run on a gRPC thread ("nexting_thread") when the batch
// completes. libgrpc keeps that promise with lock-free queues and atomics that are not
// instrumented, so TSan sees no edge and reports the reactor's own state and gRPC's
// header-inline call objects (CallOpSet, CallbackWithSuccessTag) as races.
//
// How: the two sides of the contract are public C functions of libgrpc that our code and
// libgrpc++ call through the PLT, so the executable defines them (exported by
// tsan.dynlist), tells TSan, and calls the library's:
//   grpc_call_start_batch(..., tag, ...)  releases on `tag` before starting the batch;
//   grpc_completion_queue_next/pluck      acquire on the returned event's tag.
// On Debian 12 (gRPC 1.51) the callback API's completions come from
// grpc_completion_queue_next on gRPC's "nexting_thread" (CallbackAlternativeCQ), so this
// covers the callback reactors. A gRPC build that completes callbacks inside libgrpc
// instead would need another hook; the symptom would be the races above coming back.

#include <dlfcn.h>
#include <grpc/grpc.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

namespace {

void* Real(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    std::fprintf(stderr, "grpc_tsan: %s not found after the executable: %s\n", name, dlerror());
    std::abort();
  }
  return fn;
}

void AcquireCompletion(const grpc_event& event) {
  if (event.type == GRPC_OP_COMPLETE && event.tag != nullptr) __tsan_acquire(event.tag);
}

}  // namespace

extern "C" {

grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops,
                                      void* tag, void* reserved) {
  static const auto real = reinterpret_cast<decltype(&grpc_call_start_batch)>(
      Real("grpc_call_start_batch"));
  if (tag != nullptr) __tsan_release(tag);
  return real(call, ops, nops, tag, reserved);
}

grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                      void* reserved) {
  static const auto real = reinterpret_cast<decltype(&grpc_completion_queue_next)>(
      Real("grpc_completion_queue_next"));
  const grpc_event event = real(cq, deadline, reserved);
  AcquireCompletion(event);
  return event;
}

grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag,
                                       gpr_timespec deadline, void* reserved) {
  static const auto real = reinterpret_cast<decltype(&grpc_completion_queue_pluck)>(
      Real("grpc_completion_queue_pluck"));
  const grpc_event event = real(cq, tag, deadline, reserved);
  AcquireCompletion(event);
  return event;
}

}  // extern "C"
