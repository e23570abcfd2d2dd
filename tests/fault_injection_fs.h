// Test support: a RocksDB FileSystem that forwards to the operating system's and fails
// chosen operations, as a full disk or a failing one would. The failures are set per kind
// of file (the write-ahead log, table files written by flushes and compactions, the
// MANIFEST) and per direction (writes and syncs, or reads), and hold until cleared: a disk
// stays full until space is freed.
//
// Use it through storage::StoreOptions::env (or ServiceOptions::store_env):
//   auto fs = std::make_shared<FaultInjectionFs>();
//   options.store_env = fs->NewEnv();
//   fs->FailWrites(kWalFile, FaultInjectionFs::NoSpace());   // the disk is full
//   ...
//   fs->Clear();                                            // space was freed
//
// Only data operations fail (Append, PositionedAppend, Sync, Fsync, RangeSync; Read,
// MultiRead, PositionedRead): creating, renaming and deleting files work, as they mostly do
// on a full disk. Files opened before a failure is set fail too (every file is wrapped).
//
// Thread safety: all methods may be called concurrently (RocksDB calls the files from its
// background threads).
#ifndef DECISION_TESTS_FAULT_INJECTION_FS_H_
#define DECISION_TESTS_FAULT_INJECTION_FS_H_

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/io_status.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace decision::testing {

// Kinds of files, as a bit set.
enum FileKind : unsigned {
  kWalFile = 1,       // NNNNNN.log: the write-ahead log
  kTableFile = 2,     // NNNNNN.sst: written by flushes and compactions
  kManifestFile = 4,  // MANIFEST-NNNNNN, and the temporary file that replaces CURRENT
  kOtherFile = 8,     // OPTIONS-*, IDENTITY, the info LOG, LOCK
  kAllFiles = 15,
};

// REQUIRES: owned by a std::shared_ptr (NewEnv shares it).
class FaultInjectionFs final : public rocksdb::FileSystemWrapper,
                               public std::enable_shared_from_this<FaultInjectionFs> {
 public:
  FaultInjectionFs();  // over rocksdb::FileSystem::Default()

  static FileKind KindOf(const std::string& path);
  // ENOSPC and EIO as RocksDB's POSIX file system reports them.
  static rocksdb::IOStatus NoSpace();
  static rocksdb::IOStatus Eio();

  // From now on, writes and syncs of files of `kinds` fail with `error` (replacing any
  // earlier write failure).
  void FailWrites(unsigned kinds, const rocksdb::IOStatus& error);
  // From now on, reads of files of `kinds` fail with `error`.
  void FailReads(unsigned kinds, const rocksdb::IOStatus& error);
  // Every operation works again.
  void Clear();
  // Operations failed so far.
  int64_t injected() const { return injected_.load(); }

  // An Env whose file system is this one (it keeps this alive).
  std::shared_ptr<rocksdb::Env> NewEnv();

  // The status `kind`'s writes (write = true) or reads fail with now, or OK.
  rocksdb::IOStatus Fault(FileKind kind, bool write);

  const char* Name() const override { return "DecisionFaultInjectionFs"; }
  rocksdb::IOStatus NewSequentialFile(const std::string& f, const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* r,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f,
                                        const rocksdb::FileOptions& options,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& f,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override;

 private:
  std::mutex mu_;  // guards the four below
  unsigned write_kinds_ = 0;
  rocksdb::IOStatus write_error_;
  unsigned read_kinds_ = 0;
  rocksdb::IOStatus read_error_;
  std::atomic<int64_t> injected_{0};
};

}  // namespace decision::testing

#endif  // DECISION_TESTS_FAULT_INJECTION_FS_H_
