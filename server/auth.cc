#include "server/auth.h"

#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace decision::server {
namespace {

constexpr Role kRoles[] = {Role::kDecide, Role::kObserve, Role::kExport, Role::kAdmin};
constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMaxTokensFileBytes = 16 << 20;

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidHash(absl::string_view hex) {
  if (hex.size() != 64) return false;
  for (const char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string RoleNames(unsigned roles) {
  std::vector<std::string> names;
  for (const Role r : kRoles) {
    if (roles & (1u << static_cast<int>(r))) names.push_back(RoleName(r));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kDecide: return "decide";
    case Role::kObserve: return "observe";
    case Role::kExport: return "export";
    case Role::kAdmin: return "admin";
  }
  return "unknown";
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // Fetched once: OpenSSL 3 looks the implementation up on every EVP_sha256() use, which
  // costs more than hashing a token.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_Digest(data.data(), data.size(), digest, &len, sha256, nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

bool Grant::Covers(absl::string_view problem_id) const {
  if (problems.empty()) return true;
  for (const std::string& p : problems) {
    if (p == problem_id) return true;
  }
  return false;
}

absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> ParseTokens(absl::string_view text) {
  absl::flat_hash_map<std::string, TokenEntry> table;
  absl::flat_hash_map<std::string, int> names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash_mark = line.find('#');
    if (hash_mark != absl::string_view::npos) line = line.substr(0, hash_mark);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens file line ", line_number, ": ", why,
                       " (expected: NAME ROLES sha256:HEX [problems=P,...] [expires=RFC3339])"));
    };
    if (fields.size() < 3) return bad("too few fields");
    TokenEntry entry;
    if (!ValidName(fields[0])) {
      return bad("the name must be 1-64 characters of [A-Za-z0-9._-]");
    }
    entry.name = std::string(fields[0]);
    if (auto [it, inserted] = names.emplace(entry.name, line_number); !inserted) {
      return bad(absl::StrCat("the name '", entry.name, "' is also on line ", it->second));
    }
    for (absl::string_view role : absl::StrSplit(fields[1], ',')) {
      bool known = false;
      for (const Role r : kRoles) {
        if (role == RoleName(r)) {
          entry.roles |= 1u << static_cast<int>(r);
          known = true;
        }
      }
      if (!known) {
        return bad(absl::StrCat("unknown role '", role,
                                "' (roles: decide, observe, export, admin)"));
      }
    }
    if (!absl::StartsWith(fields[2], "sha256:") || !ValidHash(fields[2].substr(7))) {
      return bad("the third field must be sha256: and 64 lower-case hex digits");
    }
    const std::string hash(fields[2].substr(7));
    for (size_t i = 3; i < fields.size(); ++i) {
      const absl::string_view f = fields[i];
      if (absl::StartsWith(f, "problems=")) {
        for (absl::string_view p : absl::StrSplit(f.substr(9), ',', absl::SkipEmpty())) {
          entry.problems.emplace_back(p);
        }
        if (entry.problems.empty()) return bad("problems= lists no problem");
      } else if (absl::StartsWith(f, "expires=")) {
        std::string error;
        if (!absl::ParseTime(absl::RFC3339_full, f.substr(8), &entry.expires, &error)) {
          return bad(absl::StrCat("expires= is not an RFC 3339 time: ", error));
        }
      } else {
        return bad(absl::StrCat("unknown field '", f.substr(0, f.find('=')), "'"));
      }
    }
    if (!table.emplace(hash, std::move(entry)).second) {
      return bad("this hash is also on an earlier line");
    }
  }
  return table;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Open(const std::string& tokens_path) {
  std::unique_ptr<Authorizer> a(new Authorizer(tokens_path));
  if (!tokens_path.empty()) {
    if (absl::Status s = a->Reload(); !s.ok()) return s;
  }
  return a;
}

absl::Status Authorizer::Reload() {
  if (open()) return absl::OkStatus();
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the tokens file ", path_));
  }
  std::string text;
  text.resize(kMaxTokensFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(in.gcount());
  if (text.size() > kMaxTokensFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokens file ", path_, " is over ", kMaxTokensFileBytes, " bytes"));
  }
  absl::StatusOr<Table> table = ParseTokens(text);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", table.status().message()));
  }
  auto shared = std::make_shared<const Table>(*std::move(table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(shared);
  return absl::OkStatus();
}

size_t Authorizer::size() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? 0 : table_->size();
}

absl::StatusOr<Grant> Authorizer::Authorize(const std::string* authorization, Role role,
                                            absl::string_view problem_id, absl::Time now) const {
  if (open()) return Grant{"anonymous", {}};
  constexpr absl::string_view kBearer = "Bearer ";
  if (authorization == nullptr) {
    return absl::UnauthenticatedError(
        "this call needs a bearer token: send the metadata 'authorization: Bearer <token>'");
  }
  if (!absl::StartsWith(*authorization, kBearer) || authorization->size() == kBearer.size()) {
    return absl::UnauthenticatedError(
        "the authorization metadata must be 'Bearer <token>'");
  }
  const std::string hash = Sha256Hex(absl::string_view(*authorization).substr(kBearer.size()));
  std::shared_ptr<const Table> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  const auto it = table->find(hash);
  if (it == table->end()) return absl::UnauthenticatedError("unknown token");
  const TokenEntry& entry = it->second;
  if (now >= entry.expires) {
    return absl::UnauthenticatedError(absl::StrCat("token '", entry.name, "' has expired"));
  }
  if (!(entry.roles & (1u << static_cast<int>(role)))) {
    return absl::PermissionDeniedError(absl::StrCat("token '", entry.name, "' has role(s) ",
                                                    RoleNames(entry.roles),
                                                    "; this call needs ", RoleName(role)));
  }
  Grant grant{entry.name, entry.problems};
  if (!problem_id.empty() && !grant.Covers(problem_id)) {
    return absl::PermissionDeniedError(absl::StrCat("token '", entry.name,
                                                    "' is not scoped to problem '",
                                                    problem_id.substr(0, 128), "'"));
  }
  return grant;
}

}  // namespace decision::server
