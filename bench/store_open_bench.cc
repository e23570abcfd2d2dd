// What opening the store costs by the threads RocksDB opens its table files with
// (max_file_opening_threads; storage::FileOpeningThreads picks it, bench/README.md "Opening
// the store"). A RocksDB directory with the store's eleven column families and 11 or 440
// table files (each a flushed memtable of 200 values), opened and closed again with 1, 2
// and RocksDB's default 16 threads. The files are in the page cache after the first open:
// this is the CPU and thread start-up cost of an open, not a cold disk's latency.
//
//   build/bench/store_open_bench
#include <benchmark/benchmark.h>

#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/store.h"

namespace decision::storage {
namespace {

constexpr int kFamilies = 11;  // the default family and kFamilyNames

std::vector<rocksdb::ColumnFamilyDescriptor> Families() {
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (int i = 1; i < kFamilies; ++i) {
    families.emplace_back(absl::StrCat("family", i), rocksdb::ColumnFamilyOptions());
  }
  return families;
}

void CloseDb(rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  handles.clear();
  db->Close().PermitUncheckedError();
  delete db;
}

// A directory with `files` table files, round robin over the families; made once per size.
std::string MakeDirectory(int files) {
  const std::string path = absl::StrCat("/tmp/store_open_bench_", files);
  if (std::filesystem::exists(path)) return path;
  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.disable_auto_compactions = true;  // keep every flushed file
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::Open(options, path, Families(), &handles, &db).ok()) std::abort();
  const std::string value(1000, 'x');
  for (int f = 0; f < files; ++f) {
    rocksdb::ColumnFamilyHandle* family = handles[f % kFamilies];
    for (int k = 0; k < 200; ++k) {
      if (!db->Put({}, family, absl::StrCat(f, "/", k), value).ok()) std::abort();
    }
    if (!db->Flush({}, family).ok()) std::abort();
  }
  CloseDb(db, handles);
  return path;
}

void BM_OpenStore(benchmark::State& state) {
  const int files = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const std::string path = MakeDirectory(files);
  rocksdb::Options options;
  options.max_file_opening_threads = threads;
  options.disable_auto_compactions = true;
  const std::vector<rocksdb::ColumnFamilyDescriptor> families = Families();
  for (auto _ : state) {
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    if (!rocksdb::DB::Open(options, path, families, &handles, &db).ok()) {
      state.SkipWithError("open");
      return;
    }
    state.PauseTiming();
    CloseDb(db, handles);
    state.ResumeTiming();
  }
  state.counters["store_picks"] = FileOpeningThreads(files);
}
BENCHMARK(BM_OpenStore)
    ->ArgNames({"files", "threads"})
    ->ArgsProduct({{11, 440}, {1, 2, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace decision::storage

BENCHMARK_MAIN();
