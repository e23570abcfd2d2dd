#include "tests/fault_injection_fs.h"

#include <utility>

namespace decision::testing {
namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

class FaultyWritableFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultyWritableFile(std::unique_ptr<rocksdb::FSWritableFile> file, FaultInjectionFs* fs,
                     FileKind kind)
      : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs), kind_(kind) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  IOStatus Append(const Slice& data, const IOOptions& options,
                  const rocksdb::DataVerificationInfo& info, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, dbg);
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const rocksdb::DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, info, dbg);
  }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Sync(options, dbg);
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Fsync(options, dbg);
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, true); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::RangeSync(offset, nbytes, options, dbg);
  }

 private:
  FaultInjectionFs* const fs_;
  const FileKind kind_;
};

class FaultyRandomAccessFile final : public rocksdb::FSRandomAccessFileOwnerWrapper {
 public:
  FaultyRandomAccessFile(std::unique_ptr<rocksdb::FSRandomAccessFile> file,
                         FaultInjectionFs* fs, FileKind kind)
      : FSRandomAccessFileOwnerWrapper(std::move(file)), fs_(fs), kind_(kind) {}

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options, Slice* result,
                char* scratch, IODebugContext* dbg) const override {
    if (IOStatus s = fs_->Fault(kind_, false); !s.ok()) return s;
    return FSRandomAccessFileOwnerWrapper::Read(offset, n, options, result, scratch, dbg);
  }
  IOStatus MultiRead(rocksdb::FSReadRequest* reqs, size_t num_reqs, const IOOptions& options,
                     IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, false); !s.ok()) {
      for (size_t i = 0; i < num_reqs; ++i) reqs[i].status = s;
      return s;
    }
    return FSRandomAccessFileOwnerWrapper::MultiRead(reqs, num_reqs, options, dbg);
  }

 private:
  FaultInjectionFs* const fs_;
  const FileKind kind_;
};

class FaultySequentialFile final : public rocksdb::FSSequentialFileOwnerWrapper {
 public:
  FaultySequentialFile(std::unique_ptr<rocksdb::FSSequentialFile> file, FaultInjectionFs* fs,
                       FileKind kind)
      : FSSequentialFileOwnerWrapper(std::move(file)), fs_(fs), kind_(kind) {}

  IOStatus Read(size_t n, const IOOptions& options, Slice* result, char* scratch,
                IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, false); !s.ok()) return s;
    return FSSequentialFileOwnerWrapper::Read(n, options, result, scratch, dbg);
  }
  IOStatus PositionedRead(uint64_t offset, size_t n, const IOOptions& options, Slice* result,
                          char* scratch, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Fault(kind_, false); !s.ok()) return s;
    return FSSequentialFileOwnerWrapper::PositionedRead(offset, n, options, result, scratch,
                                                        dbg);
  }

 private:
  FaultInjectionFs* const fs_;
  const FileKind kind_;
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

FaultInjectionFs::FaultInjectionFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

FileKind FaultInjectionFs::KindOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.rfind("MANIFEST-", 0) == 0) return kManifestFile;
  if (name.rfind("OPTIONS-", 0) == 0) return kOtherFile;
  if (EndsWith(name, ".dbtmp")) return kManifestFile;  // the next CURRENT
  if (EndsWith(name, ".log")) return kWalFile;
  if (EndsWith(name, ".sst")) return kTableFile;
  return kOtherFile;
}

IOStatus FaultInjectionFs::NoSpace() {
  return IOStatus::NoSpace("injected", "No space left on device");
}
IOStatus FaultInjectionFs::Eio() { return IOStatus::IOError("injected", "Input/output error"); }

void FaultInjectionFs::FailWrites(unsigned kinds, const IOStatus& error) {
  std::lock_guard<std::mutex> lock(mu_);
  write_kinds_ = kinds;
  write_error_ = error;
}

void FaultInjectionFs::FailReads(unsigned kinds, const IOStatus& error) {
  std::lock_guard<std::mutex> lock(mu_);
  read_kinds_ = kinds;
  read_error_ = error;
}

void FaultInjectionFs::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  write_kinds_ = read_kinds_ = 0;
}

IOStatus FaultInjectionFs::Fault(FileKind kind, bool write) {
  std::lock_guard<std::mutex> lock(mu_);
  if ((write ? write_kinds_ : read_kinds_) & kind) {
    ++injected_;
    return write ? write_error_ : read_error_;
  }
  return IOStatus::OK();
}

std::shared_ptr<rocksdb::Env> FaultInjectionFs::NewEnv() {
  return std::shared_ptr<rocksdb::Env>(rocksdb::NewCompositeEnv(shared_from_this()));
}

IOStatus FaultInjectionFs::NewSequentialFile(const std::string& f,
                                             const rocksdb::FileOptions& options,
                                             std::unique_ptr<rocksdb::FSSequentialFile>* r,
                                             IODebugContext* dbg) {
  IOStatus s = FileSystemWrapper::NewSequentialFile(f, options, r, dbg);
  if (s.ok()) r->reset(new FaultySequentialFile(std::move(*r), this, KindOf(f)));
  return s;
}

IOStatus FaultInjectionFs::NewRandomAccessFile(const std::string& f,
                                               const rocksdb::FileOptions& options,
                                               std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                               IODebugContext* dbg) {
  IOStatus s = FileSystemWrapper::NewRandomAccessFile(f, options, r, dbg);
  if (s.ok()) r->reset(new FaultyRandomAccessFile(std::move(*r), this, KindOf(f)));
  return s;
}

IOStatus FaultInjectionFs::NewWritableFile(const std::string& f,
                                           const rocksdb::FileOptions& options,
                                           std::unique_ptr<rocksdb::FSWritableFile>* r,
                                           IODebugContext* dbg) {
  IOStatus s = FileSystemWrapper::NewWritableFile(f, options, r, dbg);
  if (s.ok()) r->reset(new FaultyWritableFile(std::move(*r), this, KindOf(f)));
  return s;
}

IOStatus FaultInjectionFs::ReopenWritableFile(const std::string& f,
                                              const rocksdb::FileOptions& options,
                                              std::unique_ptr<rocksdb::FSWritableFile>* r,
                                              IODebugContext* dbg) {
  IOStatus s = FileSystemWrapper::ReopenWritableFile(f, options, r, dbg);
  if (s.ok()) r->reset(new FaultyWritableFile(std::move(*r), this, KindOf(f)));
  return s;
}

IOStatus FaultInjectionFs::ReuseWritableFile(const std::string& f, const std::string& old,
                                             const rocksdb::FileOptions& options,
                                             std::unique_ptr<rocksdb::FSWritableFile>* r,
                                             IODebugContext* dbg) {
  IOStatus s = FileSystemWrapper::ReuseWritableFile(f, old, options, r, dbg);
  if (s.ok()) r->reset(new FaultyWritableFile(std::move(*r), this, KindOf(f)));
  return s;
}

}  // namespace decision::testing
