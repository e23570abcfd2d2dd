// The private wire format between decisiond (model_sandbox.cc) and decision_model_probe
// (model_probe_main.cc). Both are built from the same sources, so the format has no version;
// integers are fixed-width in host order (the two run on the same machine).
//
//   request:  "DMP1" u32 num_arms, u32 num_features, u64 model_len, u64 num_rows,
//             model bytes, num_rows * num_features doubles
//   response: "DMR1" u32 absl::StatusCode, u64 message_len, message,
//             u64 model_len, canonical model bytes (empty unless the code is OK)
//
// The decoders treat their input as untrusted: every length is checked against the bytes
// that are there before anything is allocated.
#ifndef DECISION_SERVER_MODEL_PROBE_PROTOCOL_H_
#define DECISION_SERVER_MODEL_PROBE_PROTOCOL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace decision::server::probe {

inline constexpr char kRequestMagic[] = "DMP1";
inline constexpr char kResponseMagic[] = "DMR1";

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Reads fixed-width values and byte runs off the front of `in`; false once it runs short.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* value) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(value, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool Bytes(uint64_t n, absl::string_view* out) {
    if (in_.size() < n) return false;
    *out = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  size_t left() const { return in_.size(); }

 private:
  absl::string_view in_;
};

inline std::string EncodeRequest(int num_arms, int num_features, absl::string_view model,
                                 const std::vector<double>& rows) {
  std::string out(kRequestMagic, 4);
  Put<uint32_t>(&out, num_arms);
  Put<uint32_t>(&out, num_features);
  Put<uint64_t>(&out, model.size());
  Put<uint64_t>(&out, num_features > 0 ? rows.size() / num_features : 0);
  out.append(model.data(), model.size());
  out.append(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(double));
  return out;
}

inline std::string EncodeResponse(const absl::Status& status, absl::string_view model) {
  std::string out(kResponseMagic, 4);
  Put<uint32_t>(&out, static_cast<uint32_t>(status.code()));
  const absl::string_view message = status.message();
  Put<uint64_t>(&out, message.size());
  out.append(message.data(), message.size());
  Put<uint64_t>(&out, status.ok() ? model.size() : 0);
  if (status.ok()) out.append(model.data(), model.size());
  return out;
}

// The canonical model bytes, or the probe's refusal as INVALID_ARGUMENT (whatever code the
// probe used: every refusal is about the model).
inline absl::StatusOr<std::string> DecodeResponse(absl::string_view in) {
  Reader r(in);
  absl::string_view magic, message, model;
  uint32_t code = 0;
  uint64_t message_len = 0, model_len = 0;
  if (!r.Bytes(4, &magic) || magic != absl::string_view(kResponseMagic, 4) || !r.Get(&code) ||
      !r.Get(&message_len) || !r.Bytes(message_len, &message) || !r.Get(&model_len) ||
      !r.Bytes(model_len, &model) || r.left() != 0) {
    return absl::InternalError("model sandbox: the probe's answer is malformed");
  }
  if (code != 0) return absl::InvalidArgumentError(message);
  if (model.empty()) return absl::InternalError("model sandbox: the probe answered no model");
  return std::string(model);
}

}  // namespace decision::server::probe

#endif  // DECISION_SERVER_MODEL_PROBE_PROTOCOL_H_
