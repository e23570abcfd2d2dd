#include "bench/dataset.h"

#include <cmath>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace decision::bench {

absl::StatusOr<Dataset> LoadCsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open data set ", path));
  std::string line;
  if (!std::getline(in, line)) return absl::InvalidArgumentError(path + " is empty");
  const std::vector<std::string> header = absl::StrSplit(line, ',');
  if (header.size() < 2 || header.back() != "label") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the header must end with a `label` column"));
  }
  Dataset ds;
  ds.num_features = static_cast<int>(header.size()) - 1;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    if (cells.size() != header.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", cells.size(),
                                                     " columns, the header has ",
                                                     header.size()));
    }
    for (int f = 0; f < ds.num_features; ++f) {
      double v;
      if (!absl::SimpleAtod(cells[f], &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_no, ": `", cells[f], "` is not a finite number"));
      }
      ds.features.push_back(v);
    }
    int label;
    if (!absl::SimpleAtoi(cells.back(), &label) || label < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": label `", cells.back(), "` is not a class index"));
    }
    ds.labels.push_back(label);
    ds.num_classes = std::max(ds.num_classes, label + 1);
  }
  if (ds.labels.empty()) return absl::InvalidArgumentError(path + " has no rows");
  return ds;
}

absl::StatusOr<std::vector<int>> LoadOrder(const std::string& path, size_t rows) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open order file ", path));
  std::vector<int> order;
  std::vector<bool> seen(rows, false);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    int i;
    if (!absl::SimpleAtoi(line, &i) || i < 0 || static_cast<size_t>(i) >= rows || seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": `", line, "` is not a new row index below ", rows));
    }
    seen[i] = true;
    order.push_back(i);
  }
  if (order.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " lists ", order.size(), " rows, the data set has ", rows));
  }
  return order;
}

}  // namespace decision::bench
