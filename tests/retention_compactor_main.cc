// Helper process of tests/retention_test.cc: opens the store at argv[1], applies a
// retention cut to problem 0 (first sample argv[2], events before argv[3] ms), writes one
// byte to stdout, then compacts forever until it is killed. A process of its own (not a
// fork of the test) so that RocksDB's background threads exist in it.
#include <unistd.h>

#include <cstdlib>

#include "storage/store.h"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  auto store = decision::storage::Store::Open(argv[1], decision::storage::StoreOptions());
  if (!store.ok()) return 1;
  decision::storage::v1::RetentionRecord cut;
  cut.set_first_sample(std::atoll(argv[2]));
  cut.set_events_before_ms(std::atoll(argv[3]));
  if (!(*store)->ApplyRetention(0, {0, 1}, cut).ok()) return 1;
  const char byte = 1;
  if (write(1, &byte, 1) != 1) return 1;
  for (;;) {
    if (!(*store)->Compact().ok()) return 1;
  }
}
