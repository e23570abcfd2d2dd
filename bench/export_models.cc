// export_models: writes the XGBoost models of a problem's experts from a decisiond data
// directory to files, one per expert, that `decisionctl register-expert --xgboost=FILE` and
// `load --experts_from=DIR` accept.
//
//   export_models --data_dir=DIR --problem=ID --out=OUT_DIR [--name_contains=-trees-]
//
// No RPC returns an expert's model bytes (ListExperts gives names, kinds and states), so this
// reads them from the store, with decisiond stopped (RocksDB allows one process per data
// directory). bench/make_tree_experts.sh uses it to export the tree experts that
// `decisionctl train` had the service train. Each file is named EXPERT_ID-NAME.ubj (or .json
// for a model registered as JSON) and holds the stored bytes unchanged. For each model it
// prints its boosted rounds, trees, deepest leaf and nodes (from XGBoost's text dump).
#include <xgboost/c_api.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/store.h"

ABSL_FLAG(std::string, data_dir, "", "decisiond's --data_dir (decisiond stopped)");
ABSL_FLAG(std::string, problem, "", "problem id");
ABSL_FLAG(std::string, out, "", "directory to write the models to (created if missing)");
ABSL_FLAG(std::string, name_contains, "",
          "export only experts whose name contains this (trained tree experts: -trees-)");

namespace {

// Shape of a model: boosted rounds, trees, deepest leaf (the root is depth 0), nodes.
struct Shape {
  bst_ulong rounds = 0, trees = 0;
  int depth = 0;
  long nodes = 0;
  std::string error;
};

Shape Describe(const std::string& bytes) {
  Shape s;
  BoosterHandle booster = nullptr;
  if (XGBoosterCreate(nullptr, 0, &booster) != 0 ||
      XGBoosterLoadModelFromBuffer(booster, bytes.data(), bytes.size()) != 0) {
    s.error = XGBGetLastError();
    if (booster != nullptr) XGBoosterFree(booster);
    return s;
  }
  int rounds = 0;
  XGBoosterBoostedRounds(booster, &rounds);
  s.rounds = static_cast<bst_ulong>(rounds);
  // The text dump: one line per node, indented by one tab per level.
  bst_ulong count = 0;
  const char** dump = nullptr;
  if (XGBoosterDumpModelEx(booster, "", 0, "text", &count, &dump) == 0) {
    s.trees = count;
    for (bst_ulong t = 0; t < count; ++t) {
      for (const char* line = dump[t]; *line != '\0';) {
        int tabs = 0;
        while (line[tabs] == '\t') ++tabs;
        s.depth = std::max(s.depth, tabs);
        ++s.nodes;
        const char* end = line;
        while (*end != '\0' && *end != '\n') ++end;
        line = *end == '\n' ? end + 1 : end;
      }
    }
  }
  XGBoosterFree(booster);
  return s;
}

// XGBoost's JSON models start with `{"`; its UBJSON ones with `{` and a typed key length.
bool IsJson(const std::string& bytes) {
  return bytes.size() > 1 && bytes[0] == '{' && (bytes[1] == '"' || std::isspace(bytes[1]));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "export_models --data_dir=DIR --problem=ID --out=OUT_DIR [--name_contains=S]\n"
      "Writes the XGBoost models of a problem's experts, one file per expert, from a stopped "
      "decisiond's data directory.");
  absl::ParseCommandLine(argc, argv);
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir),
                    problem = absl::GetFlag(FLAGS_problem), out = absl::GetFlag(FLAGS_out),
                    filter = absl::GetFlag(FLAGS_name_contains);
  if (data_dir.empty() || problem.empty() || out.empty()) {
    std::fprintf(stderr, "export_models: --data_dir, --problem and --out are required\n");
    return 2;
  }
  decision::storage::StoreOptions options;
  options.create_if_missing = false;
  auto store = decision::storage::Store::Open(data_dir, options);
  if (!store.ok()) {
    std::fprintf(stderr, "export_models: %s\n", store.status().ToString().c_str());
    return 1;
  }
  int64_t index = -1;
  absl::Status s = (*store)->ForEachProblem(
      [&](uint32_t i, const decision::storage::v1::ProblemRecord& r) {
        if (r.problem_id() == problem) index = i;
        return absl::OkStatus();
      });
  if (!s.ok() || index < 0) {
    std::fprintf(stderr, "export_models: %s\n",
                 s.ok() ? absl::StrCat("no problem ", problem, " in ", data_dir).c_str()
                        : s.ToString().c_str());
    return 1;
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "export_models: cannot create %s: %s\n", out.c_str(),
                 ec.message().c_str());
    return 1;
  }
  int written = 0;
  s = (*store)->ForEachExpert(
      static_cast<uint32_t>(index),
      [&](uint32_t id, const decision::storage::v1::ExpertRecord& r) -> absl::Status {
        if (r.model().kind_case() != decision::storage::v1::ExpertModelRecord::kXgboost) {
          return absl::OkStatus();
        }
        if (!absl::StrContains(r.name(), filter)) return absl::OkStatus();
        if (r.has_unloaded_at_sample()) {
          // Retired and unloaded: the store no longer keeps its model (docs/ENGINE.md).
          std::printf("expert %u (%s): unloaded, its model is no longer stored\n", id,
                      r.name().c_str());
          return absl::OkStatus();
        }
        const std::string& bytes = r.model().xgboost();
        char prefix[16];
        std::snprintf(prefix, sizeof(prefix), "%03u-", id);
        std::string name = r.name();
        for (char& c : name) {
          if (c == '/' || c == '\0') c = '_';
        }
        const std::string path =
            absl::StrCat(out, "/", prefix, name, IsJson(bytes) ? ".json" : ".ubj");
        std::ofstream file(path, std::ios::binary);
        file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        if (!file.flush()) return absl::InternalError(absl::StrCat("cannot write ", path));
        const Shape shape = Describe(bytes);
        if (!shape.error.empty()) {
          std::printf("%s: %zu bytes (XGBoost cannot load it: %s)\n", path.c_str(), bytes.size(),
                      shape.error.c_str());
        } else {
          std::printf("%s: %zu bytes, %llu rounds, %llu trees, depth %d, %ld nodes\n",
                      path.c_str(), bytes.size(), static_cast<unsigned long long>(shape.rounds),
                      static_cast<unsigned long long>(shape.trees), shape.depth, shape.nodes);
        }
        ++written;
        return absl::OkStatus();
      });
  if (!s.ok()) {
    std::fprintf(stderr, "export_models: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%d model(s) written to %s\n", written, out.c_str());
  return written > 0 ? 0 : 1;
}
