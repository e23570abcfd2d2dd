// The on-disk format of the decision service's store: column families, key layouts and chunk
// sizes. CHANGING ANYTHING IN THIS FILE CHANGES THE FORMAT: a store written by one version
// would be misread by the other. Records are in storage/records.proto (the same rule holds
// for their field numbers and enum values).
//
// Column families (keys are fixed-width big-endian integers, so that RocksDB's byte order is
// numeric order; the event id suffix is the caller's bytes):
//   problems     u32 problem                          -> ProblemRecord
//   experts      u32 problem, u32 expert              -> ExpertRecord (state; model kind)
//                u32 problem, u32 expert, 'm'         -> ExpertModelRecord (the model's
//                                                        payload, for a record with
//                                                        model_apart; just after its record)
//   events       u32 problem, event id bytes          -> EventRecord (pending or joined)
//   pending      u32 problem, u64 deadline_ms, event id bytes -> "" (index of pending events)
//   samples      u32 problem, u64 sequence            -> SampleRecord (the log, join order)
//   backfill     u32 problem, u32 expert, u64 chunk   -> BackfillChunk (per-expert columns)
//   checkpoints  u32 problem                          -> CheckpointRecord
//   logchunks    u32 problem, u64 chunk               -> LogChunk (the estimators' view)
//   audit        u64 sequence                         -> AuditRecord (admin actions)
//   training_jobs u32 problem, u64 job id             -> TrainingJobRecord
#ifndef DECISION_STORAGE_FORMAT_H_
#define DECISION_STORAGE_FORMAT_H_

#include <cstdint>

namespace decision::storage {

// Family names, in the order Store opens them. Never rename one.
inline constexpr const char* kFamilyNames[] = {"problems", "experts",     "events",  "samples",
                                               "backfill", "checkpoints", "pending", "logchunks",
                                               "audit",    "training_jobs"};

// The families [0, kProblemFamilies) of kFamilyNames hold a problem's records, every key
// starting with its index: moving a problem (DecisionService.BeginMove) copies exactly
// those. The audit log and training jobs (the families after them) stay where they were
// written.
inline constexpr int kProblemFamilies = 8;

// Samples per LogChunk record: chunk c holds samples [c * kLogChunkSamples, (c + 1) *
// kLogChunkSamples).
inline constexpr int64_t kLogChunkSamples = 4096;
// Samples per BackfillChunk record, the same way.
inline constexpr int64_t kBackfillChunkSamples = 4096;

}  // namespace decision::storage

#endif  // DECISION_STORAGE_FORMAT_H_
