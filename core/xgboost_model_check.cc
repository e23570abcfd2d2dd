#include "core/xgboost_model_check.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/charconv.h"
#include "absl/strings/str_cat.h"
#include "core/expert.h"
#include "core/status_macros.h"

namespace decision {
namespace {

// ---------------------------------------------------------------------------------------
// The document: a flat array of values in document order (pre-order), 16 bytes each.
//
// A container's members follow it; `subtree` says how many records the container and
// everything inside it take, so the next sibling of record i is i + Span(i). An object's
// members are (key, value) pairs of records: the key is a kString record.

enum class Kind : uint8_t {
  kNull,
  kBool,
  kInteger,     // JSON integer, UBJSON i U I l L C: libxgboost's Integer (int64)
  kNumber,      // JSON number with '.' or an exponent, NaN, Infinity; UBJSON d: float
  kString,
  kArray,       // libxgboost's generic Array
  kObject,
  kTypedArray,  // UBJSON [$ ...: libxgboost's F32Array, U8Array, I32Array, I64Array
};

// Element type of a typed array, as UBJSON's type marker names it.
enum class Elem : uint8_t { kNone, kF32, kU8, kI32, kI64 };

const char* ElemName(Elem e) {
  switch (e) {
    case Elem::kF32: return "float32";
    case Elem::kU8: return "uint8";
    case Elem::kI32: return "int32";
    case Elem::kI64: return "int64";
    case Elem::kNone: break;
  }
  return "untyped";
}

size_t ElemSize(Elem e) {
  switch (e) {
    case Elem::kF32: return 4;
    case Elem::kU8: return 1;
    case Elem::kI32: return 4;
    case Elem::kI64: return 8;
    case Elem::kNone: break;
  }
  return 0;
}

struct Value {
  Kind kind = Kind::kNull;
  Elem elem = Elem::kNone;
  bool in_arena = false;  // kString: the text is in Document::arena, not in the input
  // kArray, kTypedArray: elements; kObject: members; kString: length in bytes.
  uint32_t count = 0;
  union {
    int64_t integer;   // kInteger; kBool: 0 or 1
    double number;     // kNumber: a float, widened
    uint64_t offset;   // kString, kTypedArray: where the bytes start
    uint64_t subtree;  // kArray, kObject: records in this container, itself included
  };
  Value() : integer(0) {}
};
static_assert(sizeof(Value) == 16, "one record per value: keep it small");

struct Document {
  absl::string_view input;
  std::string arena;  // decoded JSON strings that contained escapes
  std::vector<Value> values;

  size_t Span(size_t i) const {
    const Value& v = values[i];
    return v.kind == Kind::kArray || v.kind == Kind::kObject ? v.subtree : 1;
  }
  absl::string_view Text(size_t i) const {
    const Value& v = values[i];
    return v.in_arena ? absl::string_view(arena).substr(v.offset, v.count)
                      : input.substr(v.offset, v.count);
  }
};

constexpr size_t kMissing = std::numeric_limits<size_t>::max();

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("xgboost model: ", message));
}

bool FitsFloat(double d) {
  return std::fabs(d) <= static_cast<double>(std::numeric_limits<float>::max());
}

// Widens a parsed double to the float libxgboost stores (its Number is a float), without
// the undefined behaviour of converting an out-of-range double.
double AsFloat(double d) {
  if (std::isnan(d)) return d;
  if (!FitsFloat(d)) return d > 0 ? std::numeric_limits<double>::infinity()
                                  : -std::numeric_limits<double>::infinity();
  return static_cast<double>(static_cast<float>(d));
}

// Reads a big-endian integer of `n` bytes (n <= 8).
uint64_t ReadBigEndian(const char* p, size_t n) {
  uint64_t u = 0;
  for (size_t i = 0; i < n; ++i) u = (u << 8) | static_cast<unsigned char>(p[i]);
  return u;
}

// ---------------------------------------------------------------------------------------
// The parsers. Both are loops over an explicit stack of open containers, whose height is
// checked against max_nesting_depth before a container is opened.

struct Frame {
  size_t value;        // the container's record
  bool object;
  bool counted;        // UBJSON [# L n: no closing ']'
  uint64_t remaining;  // counted arrays: elements still to read
  uint32_t count;      // members or elements read so far
};

class ParserBase {
 public:
  ParserBase(absl::string_view input, const XgboostModelLimits& limits, Document* doc)
      : in_(input), limits_(limits), doc_(doc) {
    doc_->input = input;
  }
  virtual ~ParserBase() = default;

 protected:

  size_t Left() const { return in_.size() - pos_; }

  absl::Status AddValue(Value v, size_t extra_values = 0) {
    values_ += 1 + extra_values;
    if (values_ > static_cast<uint64_t>(limits_.max_values)) {
      return Error(absl::StrCat("more than ", limits_.max_values, " values (the limit)"));
    }
    doc_->values.push_back(v);
    return absl::OkStatus();
  }

  absl::Status Open(bool object, bool counted = false, uint64_t remaining = 0) {
    if (stack_.size() >= static_cast<size_t>(limits_.max_nesting_depth)) {
      return Error(absl::StrCat("containers nest deeper than ", limits_.max_nesting_depth,
                                " levels (the limit)"));
    }
    Value v;
    v.kind = object ? Kind::kObject : Kind::kArray;
    DECISION_RETURN_IF_ERROR(AddValue(v));
    stack_.push_back(Frame{doc_->values.size() - 1, object, counted, remaining, 0});
    return absl::OkStatus();
  }

  void Close() {
    const Frame& f = stack_.back();
    Value& v = doc_->values[f.value];
    v.count = f.count;
    v.subtree = doc_->values.size() - f.value;
    stack_.pop_back();
  }

  virtual absl::Status Error(absl::string_view what) const = 0;

  absl::string_view in_;
  size_t pos_ = 0;
  const XgboostModelLimits& limits_;
  Document* doc_;
  std::vector<Frame> stack_;
  uint64_t values_ = 0;
};

// JSON as libxgboost 1.7.4's JsonReader reads it (src/common/json.cc), or stricter:
//  - whitespace is space, \t, \n, \r (JsonReader::SkipSpaces);
//  - escapes are \r \n \\ \t \" and \u, which libxgboost keeps as the two characters "\u"
//    followed by whatever comes next; \/ \b \f are refused, as libxgboost refuses them;
//  - raw control characters and the byte 0xff (which JsonReader mistakes for EOF) are
//    refused in strings;
//  - numbers: '-'? ('0' | [1-9][0-9]*) ('.' [0-9]+)? ([eE] [+-]? [0-9]+)?, or NaN,
//    Infinity, -Infinity. With '.' or an exponent it is a float (libxgboost's Number),
//    else an int64 (Integer); an integer that overflows int64 is refused (libxgboost wraps
//    it), as is a float out of double's range. Leading zeros, '+' and "1." are refused
//    (libxgboost accepts some of them; no writer of XGBoost models emits them);
//  - an empty array is "[]" with no space inside (JsonReader refuses "[ ]"); no trailing
//    commas; only whitespace after the document (libxgboost ignores what follows).
class JsonParser final : public ParserBase {
 public:
  using ParserBase::ParserBase;

  absl::Status Parse() {
    bool need_value = true;
    while (true) {
      if (need_value) {
        SkipSpaces();
        if (pos_ == in_.size()) return Error("the input ends where a value should be");
        const char c = in_[pos_];
        if (c == '{' || c == '[') {
          DECISION_RETURN_IF_ERROR(Open(c == '{'));
          ++pos_;
        } else {
          DECISION_RETURN_IF_ERROR(ParseScalar());
        }
        need_value = false;
        continue;
      }
      if (stack_.empty()) break;
      // Inside a container, after opening it or after a value: what comes next.
      Frame& f = stack_.back();
      if (f.count == 0 && !f.object) {
        // JsonReader::ParseArray looks for ']' right after '[' without skipping spaces.
        if (pos_ < in_.size() && in_[pos_] == ']') {
          ++pos_;
          Close();
          continue;
        }
        ++f.count;
        need_value = true;
        continue;
      }
      SkipSpaces();
      if (pos_ == in_.size()) {
        return Error(f.object ? "the input ends inside an object"
                              : "the input ends inside an array");
      }
      if (f.count == 0) {  // an object just opened
        if (in_[pos_] == '}') {
          ++pos_;
          Close();
          continue;
        }
        DECISION_RETURN_IF_ERROR(ParseKeyAndColon());
        ++f.count;
        need_value = true;
        continue;
      }
      const char c = in_[pos_++];
      if (c == ',') {
        if (f.object) {
          SkipSpaces();
          DECISION_RETURN_IF_ERROR(ParseKeyAndColon());
        }
        ++f.count;
        need_value = true;
        continue;
      }
      if (c == (f.object ? '}' : ']')) {
        Close();
        continue;
      }
      --pos_;
      return Error(f.object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    SkipSpaces();
    if (pos_ != in_.size()) return Error("bytes follow the end of the document");
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const override {
    return Invalid(absl::StrCat("malformed JSON at byte ", pos_, ": ", what));
  }

  void SkipSpaces() {
    while (pos_ < in_.size()) {
      const char c = in_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (in_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseKeyAndColon() {
    if (pos_ == in_.size() || in_[pos_] != '"') return Error("expected '\"' to start a key");
    DECISION_RETURN_IF_ERROR(ParseString());
    SkipSpaces();
    if (pos_ == in_.size() || in_[pos_] != ':') return Error("expected ':' after a key");
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status ParseScalar() {
    const char c = in_[pos_];
    Value v;
    if (c == '"') return ParseString();
    if (c == 't' || c == 'f' || c == 'n') {
      if (Consume("true")) {
        v.kind = Kind::kBool;
        v.integer = 1;
      } else if (Consume("false")) {
        v.kind = Kind::kBool;
        v.integer = 0;
      } else if (Consume("null")) {
        v.kind = Kind::kNull;
      } else {
        return Error("expected true, false or null");
      }
      return AddValue(v);
    }
    if (c == '-' || (c >= '0' && c <= '9') || c == 'N' || c == 'I') return ParseNumber();
    return Error(absl::StrCat("unexpected character (byte 0x",
                              absl::Hex(static_cast<unsigned char>(c)), ")"));
  }

  absl::Status ParseString() {
    const size_t open = pos_++;  // the opening quote
    const size_t start = pos_;
    bool escaped = false;        // the text so far has been copied to the arena
    size_t arena_start = 0;
    while (true) {
      if (pos_ == in_.size()) {
        pos_ = open;
        return Error("a string is not terminated");
      }
      const unsigned char c = static_cast<unsigned char>(in_[pos_]);
      if (c == '"') break;
      if (c < 0x20 || c == 0xff) {
        return Error(absl::StrCat("byte 0x", absl::Hex(c), " inside a string"));
      }
      if (c != '\\') {
        if (escaped) doc_->arena.push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      if (!escaped) {
        escaped = true;
        arena_start = doc_->arena.size();
        doc_->arena.append(in_.data() + start, pos_ - start);
      }
      if (pos_ + 1 == in_.size()) return Error("the input ends inside an escape");
      const char e = in_[pos_ + 1];
      switch (e) {
        case 'r': doc_->arena.push_back('\r'); break;
        case 'n': doc_->arena.push_back('\n'); break;
        case '\\': doc_->arena.push_back('\\'); break;
        case 't': doc_->arena.push_back('\t'); break;
        case '"': doc_->arena.push_back('"'); break;
        case 'u': doc_->arena.append("\\u"); break;  // as libxgboost 1.7.4 does
        default:
          return Error(absl::StrCat("the escape \\", std::string(1, e),
                                    " (libxgboost 1.7.4 reads only \\r \\n \\\\ \\t \\\" \\u)"));
      }
      pos_ += 2;
    }
    Value v;
    v.kind = Kind::kString;
    v.in_arena = escaped;
    v.offset = escaped ? arena_start : start;
    v.count = static_cast<uint32_t>(escaped ? doc_->arena.size() - arena_start : pos_ - start);
    ++pos_;  // the closing quote
    return AddValue(v);
  }

  absl::Status ParseNumber() {
    const size_t start = pos_;
    Value v;
    v.kind = Kind::kNumber;
    if (Consume("NaN")) {
      v.number = std::numeric_limits<double>::quiet_NaN();
      return AddValue(v);
    }
    const bool negative = in_[pos_] == '-';
    if (negative) ++pos_;
    if (Consume("Infinity")) {
      v.number = negative ? -std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::infinity();
      return AddValue(v);
    }
    auto digit = [&] { return pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9'; };
    if (!digit()) return Error("expected a digit");
    const size_t int_start = pos_;
    if (in_[pos_] == '0') {
      ++pos_;
      if (digit()) return Error("a number has a leading zero");
    } else {
      while (digit()) ++pos_;
    }
    const size_t int_end = pos_;
    bool is_float = false;
    if (pos_ < in_.size() && in_[pos_] == '.') {
      ++pos_;
      if (!digit()) return Error("expected a digit after '.'");
      while (digit()) ++pos_;
      is_float = true;
    }
    if (pos_ < in_.size() && (in_[pos_] == 'e' || in_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < in_.size() && (in_[pos_] == '+' || in_[pos_] == '-')) ++pos_;
      if (!digit()) return Error("expected a digit in an exponent");
      while (digit()) ++pos_;
      is_float = true;
    }
    if (is_float) {
      double d = 0;
      const absl::from_chars_result r =
          absl::from_chars(in_.data() + start, in_.data() + pos_, d);
      if (r.ec != std::errc() || r.ptr != in_.data() + pos_) {
        pos_ = start;
        return Error("a number is out of range");
      }
      v.number = AsFloat(d);
      return AddValue(v);
    }
    uint64_t magnitude = 0;
    for (size_t i = int_start; i < int_end; ++i) {
      const uint64_t d = static_cast<uint64_t>(in_[i] - '0');
      if (magnitude > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - d) / 10) {
        pos_ = start;
        return Error("an integer overflows int64");
      }
      magnitude = magnitude * 10 + d;
    }
    v.kind = Kind::kInteger;
    v.integer = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
    return AddValue(v);
  }
};

// UBJSON as libxgboost 1.7.4's UBJReader reads it (src/common/json.cc,
// include/xgboost/json_io.h), or stricter. Numbers are big-endian.
//  - values: Z (null), T, F (UBJReader reads F as true: a 1.7.4 bug, mirrored), i U I l L C
//    (integers; C is a signed char), d (float32), S (string), [ and {;
//  - refused as UBJReader refuses them: D (float64), H (high precision), N (no-op), and any
//    other marker;
//  - strings and object keys: 'L' then an int64 length (UBJReader::DecodeStr reads no
//    other length marker); the length must fit in what is left of the input;
//  - arrays: [$ t # L n with t one of d U l L (typed: no closing ']'); [# L n (counted: n
//    values, no closing ']'); or values up to ']'. n must be >= 0 and fit in what is left
//    (UBJReader allocates n elements before reading them);
//  - objects: keys and values up to '}' (no $ or # form);
//  - nothing may follow the document.
// UBJReader itself reads past the end of its input on a truncated document and never
// returns from an unterminated array (it parses end-of-input as null, forever).
class UbjsonParser final : public ParserBase {
 public:
  using ParserBase::ParserBase;

  absl::Status Parse() {
    bool need_value = true;
    while (true) {
      if (need_value) {
        DECISION_RETURN_IF_ERROR(ParseValue());
        need_value = false;
        continue;
      }
      if (stack_.empty()) break;
      Frame& f = stack_.back();
      if (f.counted) {
        if (f.remaining == 0) {
          Close();
          continue;
        }
        --f.remaining;
        ++f.count;
        need_value = true;
        continue;
      }
      if (pos_ == in_.size()) {
        return Error(f.object ? "the input ends inside an object"
                              : "the input ends inside an array");
      }
      if (in_[pos_] == (f.object ? '}' : ']')) {
        ++pos_;
        Close();
        continue;
      }
      if (f.object) DECISION_RETURN_IF_ERROR(ParseString(/*is_key=*/true));
      ++f.count;
      need_value = true;
    }
    if (pos_ != in_.size()) return Error("bytes follow the end of the document");
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const override {
    return Invalid(absl::StrCat("malformed UBJSON at byte ", pos_, ": ", what));
  }

  absl::Status Need(size_t n, absl::string_view what) const {
    if (Left() < n) return Error(absl::StrCat("the input ends inside ", what));
    return absl::OkStatus();
  }

  // Reads 'L' and an int64 that must be in [0, Left() / unit]: a length or a count.
  absl::Status ReadLength(absl::string_view what, size_t unit, uint64_t* out) {
    DECISION_RETURN_IF_ERROR(Need(1, what));
    if (in_[pos_] != 'L') {
      return Error(absl::StrCat("the ", what, " is not written as an int64 ('L'), the only ",
                                "form libxgboost 1.7.4 reads"));
    }
    ++pos_;
    DECISION_RETURN_IF_ERROR(Need(8, what));
    const int64_t n = static_cast<int64_t>(ReadBigEndian(in_.data() + pos_, 8));
    if (n < 0) return Error(absl::StrCat("the ", what, " is negative (", n, ")"));
    pos_ += 8;
    if (static_cast<uint64_t>(n) > Left() / unit) {
      return Error(absl::StrCat("the ", what, " ", n, " is more than the ", Left(),
                                " bytes left can hold"));
    }
    *out = static_cast<uint64_t>(n);
    return absl::OkStatus();
  }

  absl::Status ParseString(bool is_key) {
    const absl::string_view what = is_key ? "key length" : "string length";
    uint64_t n = 0;
    DECISION_RETURN_IF_ERROR(ReadLength(what, 1, &n));
    Value v;
    v.kind = Kind::kString;
    v.offset = pos_;
    v.count = static_cast<uint32_t>(n);
    pos_ += n;
    return AddValue(v);
  }

  absl::Status ParseInteger(size_t size, bool is_signed) {
    DECISION_RETURN_IF_ERROR(Need(size, "an integer"));
    const uint64_t u = ReadBigEndian(in_.data() + pos_, size);
    pos_ += size;
    Value v;
    v.kind = Kind::kInteger;
    if (!is_signed || size == 8) {
      v.integer = static_cast<int64_t>(u);
    } else {
      const uint64_t sign = uint64_t{1} << (8 * size - 1);
      v.integer = static_cast<int64_t>(u ^ sign) - static_cast<int64_t>(sign);
    }
    return AddValue(v);
  }

  absl::Status ParseValue() {
    if (pos_ == in_.size()) return Error("the input ends where a value should be");
    const char marker = in_[pos_++];
    Value v;
    switch (marker) {
      case '{':
        return Open(/*object=*/true);
      case '[':
        return ParseArrayStart();
      case 'Z':
        return AddValue(v);
      case 'T':
      case 'F':
        v.kind = Kind::kBool;
        v.integer = 1;  // UBJReader::Parse returns true for 'F' too
        return AddValue(v);
      case 'd': {
        DECISION_RETURN_IF_ERROR(Need(4, "a float32"));
        const uint32_t bits = static_cast<uint32_t>(ReadBigEndian(in_.data() + pos_, 4));
        pos_ += 4;
        float f;
        std::memcpy(&f, &bits, 4);
        v.kind = Kind::kNumber;
        v.number = f;
        return AddValue(v);
      }
      case 'S':
        return ParseString(/*is_key=*/false);
      case 'i': return ParseInteger(1, true);
      case 'C': return ParseInteger(1, true);  // char is signed on the platforms we build on
      case 'U': return ParseInteger(1, false);
      case 'I': return ParseInteger(2, true);
      case 'l': return ParseInteger(4, true);
      case 'L': return ParseInteger(8, true);
      case 'D':
        --pos_;
        return Error("a float64 ('D'), which libxgboost 1.7.4 does not read");
      case 'H':
        --pos_;
        return Error("a high-precision number ('H'), which libxgboost 1.7.4 does not read");
      case 'N':
        --pos_;
        return Error("a no-op ('N'), which libxgboost 1.7.4 does not read");
      default:
        --pos_;
        return Error(absl::StrCat("unknown marker (byte 0x",
                                  absl::Hex(static_cast<unsigned char>(marker)), ")"));
    }
  }

  absl::Status ParseArrayStart() {
    if (pos_ < in_.size() && in_[pos_] == '$') {
      ++pos_;
      DECISION_RETURN_IF_ERROR(Need(2, "a typed array's header"));
      const char type = in_[pos_++];
      Elem elem = Elem::kNone;
      switch (type) {
        case 'd': elem = Elem::kF32; break;
        case 'U': elem = Elem::kU8; break;
        case 'l': elem = Elem::kI32; break;
        case 'L': elem = Elem::kI64; break;
        default:
          --pos_;
          return Error(absl::StrCat("a typed array of '", std::string(1, type),
                                    "', which libxgboost 1.7.4 does not read (only d U l L)"));
      }
      if (in_[pos_] != '#') return Error("a typed array without a count ('#')");
      ++pos_;
      uint64_t n = 0;
      DECISION_RETURN_IF_ERROR(ReadLength("typed array's count", ElemSize(elem), &n));
      if (stack_.size() >= static_cast<size_t>(limits_.max_nesting_depth)) {
        return Error(absl::StrCat("containers nest deeper than ", limits_.max_nesting_depth,
                                  " levels (the limit)"));
      }
      Value v;
      v.kind = Kind::kTypedArray;
      v.elem = elem;
      v.count = static_cast<uint32_t>(n);
      v.offset = pos_;
      pos_ += n * ElemSize(elem);
      return AddValue(v, n);
    }
    if (pos_ < in_.size() && in_[pos_] == '#') {
      ++pos_;
      uint64_t n = 0;
      DECISION_RETURN_IF_ERROR(ReadLength("array count", 1, &n));  // a value is >= 1 byte
      return Open(/*object=*/false, /*counted=*/true, n);
    }
    return Open(/*object=*/false);
  }
};

// Every key of every object must be distinct: libxgboost's JSON reader keeps the last of
// two equal keys and its UBJSON reader the first, so a duplicate would let this check and
// libxgboost read different models.
absl::Status CheckNoDuplicateKeys(const Document& doc) {
  absl::flat_hash_set<absl::string_view> keys;
  for (size_t i = 0; i < doc.values.size(); ++i) {
    const Value& v = doc.values[i];
    if (v.kind != Kind::kObject || v.count < 2) continue;
    keys.clear();
    size_t at = i + 1;
    for (uint32_t m = 0; m < v.count; ++m) {
      const absl::string_view key = doc.Text(at);
      if (!keys.insert(key).second) {
        return Invalid(absl::StrCat("an object has the key \"", key,
                                    "\" twice (libxgboost's JSON reader keeps the last, its "
                                    "UBJSON reader the first)"));
      }
      at += 1;              // the key
      at += doc.Span(at);   // the value
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// The model.

const char* KindName(const Value& v) {
  switch (v.kind) {
    case Kind::kNull: return "null";
    case Kind::kBool: return "a boolean";
    case Kind::kInteger: return "an integer";
    case Kind::kNumber: return "a float";
    case Kind::kString: return "a string";
    case Kind::kArray: return "an array";
    case Kind::kObject: return "an object";
    case Kind::kTypedArray: return "a typed array";
  }
  return "?";
}

// Parses a decimal integer written the way libxgboost writes parameters (to_chars):
// '-'? ('0' | [1-9][0-9]*), in int64.
bool ParseDecimal(absl::string_view s, int64_t* out) {
  size_t i = 0;
  const bool negative = !s.empty() && s[0] == '-';
  if (negative) i = 1;
  if (i == s.size() || (s[i] == '0' && s.size() > i + 1)) return false;
  uint64_t magnitude = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (magnitude > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - d) / 10) {
      return false;
    }
    magnitude = magnitude * 10 + d;
  }
  *out = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  return true;
}

// Parses a float parameter ('-'? digits ('.' digits)? ([eE] [+-]? digits)?) into a finite
// float, widened.
bool ParseFiniteFloat(absl::string_view s, double* out) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (!digits()) return false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  if (i != s.size()) return false;
  double d = 0;
  const absl::from_chars_result r = absl::from_chars(s.data(), s.data() + s.size(), d);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || !FitsFloat(d)) return false;
  *out = AsFloat(d);
  return std::isfinite(*out);
}

// libxgboost's RegTree::kDeletedNodeMarker is a split index word of all ones: split index
// 2^31 - 1 with the default-left bit.
constexpr int64_t kDeletedSplitIndex = 2147483647;

// One tree's per-node arrays, read out of the document.
struct TreeArrays {
  std::vector<int64_t> left, right, parent, split_index, default_left, split_type;
  std::vector<double> split_condition, base_weight, loss_change, sum_hessian;
};

class ModelChecker {
 public:
  ModelChecker(const Document& doc, int num_arms, int num_features,
               const XgboostModelLimits& limits, XgboostForest* forest)
      : doc_(doc),
        num_arms_(num_arms),
        num_features_(num_features),
        limits_(limits),
        forest_(forest) {}

  absl::Status Check() {
    const size_t root = 0;
    DECISION_RETURN_IF_ERROR(RequireKind(root, Kind::kObject, "the document"));
    DECISION_RETURN_IF_ERROR(CheckVersion(root));
    size_t learner;
    DECISION_RETURN_IF_ERROR(RequireMember(root, "learner", Kind::kObject, "", &learner));

    // Objective and booster first: they say what kind of model this is, and a model of
    // the wrong kind is better named so than by its class count.
    size_t objective, gradient_booster, model_param;
    DECISION_RETURN_IF_ERROR(
        RequireMember(learner, "objective", Kind::kObject, "learner", &objective));
    absl::string_view objective_name;
    DECISION_RETURN_IF_ERROR(
        RequireString(objective, "name", "learner.objective", &objective_name));
    if (objective_name != "multi:softprob") {
      return Invalid(absl::StrCat("the objective is '", objective_name,
                                  "'; a stochastic expert needs multi:softprob "
                                  "(per-arm probabilities)"));
    }
    DECISION_RETURN_IF_ERROR(RequireMember(learner, "gradient_booster", Kind::kObject,
                                           "learner", &gradient_booster));
    absl::string_view booster;
    DECISION_RETURN_IF_ERROR(
        RequireString(gradient_booster, "name", "learner.gradient_booster", &booster));
    if (booster == "dart") {
      return Invalid(
          "the booster is dart, which is not accepted (its weight_drop array and dropout "
          "parameters are not checked); train with booster gbtree or gblinear");
    }
    if (booster != "gbtree" && booster != "gblinear") {
      return Invalid(absl::StrCat("the booster is '", booster,
                                  "'; only gbtree and gblinear are accepted"));
    }

    DECISION_RETURN_IF_ERROR(RequireMember(learner, "learner_model_param", Kind::kObject,
                                           "learner", &model_param));
    DECISION_RETURN_IF_ERROR(CheckLearnerModelParam(model_param));
    DECISION_RETURN_IF_ERROR(CheckObjective(objective));

    size_t model;
    DECISION_RETURN_IF_ERROR(RequireMember(gradient_booster, "model", Kind::kObject,
                                           "learner.gradient_booster", &model));
    if (booster == "gbtree") {
      DECISION_RETURN_IF_ERROR(CheckGbtree(model));
    } else {
      DECISION_RETURN_IF_ERROR(CheckGblinear(model));
    }

    // LearnerIO::LoadModel: get<Object const>(learner.at("attributes")), string values.
    size_t attributes;
    DECISION_RETURN_IF_ERROR(
        RequireMember(learner, "attributes", Kind::kObject, "learner", &attributes));
    DECISION_RETURN_IF_ERROR(RequireStringMembers(attributes, "learner.attributes"));
    for (const char* key : {"feature_names", "feature_types"}) {
      const size_t names = Member(learner, key);
      if (names == kMissing) continue;
      const std::string path = absl::StrCat("learner.", key);
      DECISION_RETURN_IF_ERROR(RequireKind(names, Kind::kArray, path));
      size_t at = names + 1;
      for (uint32_t i = 0; i < doc_.values[names].count; ++i, at += doc_.Span(at)) {
        DECISION_RETURN_IF_ERROR(
            RequireKind(at, Kind::kString, absl::StrCat(path, "[", i, "]")));
      }
    }
    return absl::OkStatus();
  }

 private:
  // --- Access to the document.

  size_t Member(size_t object, absl::string_view key) const {
    size_t at = object + 1;
    for (uint32_t m = 0; m < doc_.values[object].count; ++m) {
      if (doc_.Text(at) == key) return at + 1;
      at += 1;
      at += doc_.Span(at);
    }
    return kMissing;
  }

  absl::Status RequireKind(size_t i, Kind kind, absl::string_view path) const {
    Value want;
    want.kind = kind;
    if (doc_.values[i].kind != kind) {
      return Invalid(absl::StrCat(path, " is ", KindName(doc_.values[i]), ", not ",
                                  KindName(want)));
    }
    return absl::OkStatus();
  }

  static std::string Path(absl::string_view parent, absl::string_view key) {
    return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
  }

  absl::Status RequireMember(size_t object, absl::string_view key, Kind kind,
                             absl::string_view parent, size_t* out) const {
    *out = Member(object, key);
    if (*out == kMissing) {
      return Invalid(absl::StrCat(parent.empty() ? "the document" : parent, " has no \"", key,
                                  "\""));
    }
    return RequireKind(*out, kind, Path(parent, key));
  }

  absl::Status RequireString(size_t object, absl::string_view key, absl::string_view parent,
                             absl::string_view* out) const {
    size_t at;
    DECISION_RETURN_IF_ERROR(RequireMember(object, key, Kind::kString, parent, &at));
    *out = doc_.Text(at);
    return absl::OkStatus();
  }

  // libxgboost's FromJson(obj, &param): every member's value must be a string.
  absl::Status RequireStringMembers(size_t object, absl::string_view path) const {
    size_t at = object + 1;
    for (uint32_t m = 0; m < doc_.values[object].count; ++m) {
      const size_t value = at + 1;
      DECISION_RETURN_IF_ERROR(
          RequireKind(value, Kind::kString, Path(path, doc_.Text(at))));
      at = value + doc_.Span(value);
    }
    return absl::OkStatus();
  }

  // A parameter stored as a decimal string. If `key` is absent, *out = fallback unless
  // `required`. The value must lie in [lo, hi].
  absl::Status IntParam(size_t object, absl::string_view key, absl::string_view parent,
                        bool required, int64_t fallback, int64_t lo, int64_t hi,
                        int64_t* out) const {
    const size_t at = Member(object, key);
    const std::string path = Path(parent, key);
    if (at == kMissing) {
      if (required) return Invalid(absl::StrCat(parent, " has no \"", key, "\""));
      *out = fallback;
      return absl::OkStatus();
    }
    DECISION_RETURN_IF_ERROR(RequireKind(at, Kind::kString, path));
    const absl::string_view text = doc_.Text(at);
    if (!ParseDecimal(text, out)) {
      return Invalid(absl::StrCat(path, " is \"", text, "\", not a decimal integer"));
    }
    if (*out < lo || *out > hi) {
      return Invalid(absl::StrCat(path, " is ", *out, ", outside [", lo, ", ", hi, "]"));
    }
    return absl::OkStatus();
  }

  // --- The learner.

  // Version::Load: optional in libxgboost, written by every 1.x; required here.
  absl::Status CheckVersion(size_t root) const {
    size_t version;
    DECISION_RETURN_IF_ERROR(RequireMember(root, "version", Kind::kArray, "", &version));
    if (doc_.values[version].count != 3) {
      return Invalid(absl::StrCat("version has ", doc_.values[version].count,
                                  " entries, not 3"));
    }
    for (size_t i = 0; i < 3; ++i) {
      DECISION_RETURN_IF_ERROR(
          RequireKind(version + 1 + i, Kind::kInteger, absl::StrCat("version[", i, "]")));
    }
    return absl::OkStatus();
  }

  // LearnerModelParamLegacy::FromJson.
  absl::Status CheckLearnerModelParam(size_t param) {
    constexpr absl::string_view kPath = "learner.learner_model_param";
    int64_t num_class = 0, num_feature = 0, num_target = 0, boost_from_average = 0;
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_class", kPath, true, 0, 0,
                                      std::numeric_limits<int32_t>::max(), &num_class));
    if (num_class != num_arms_) {
      return Invalid(absl::StrCat("the model has ", num_class,
                                  " classes (learner_model_param.num_class), the problem has ",
                                  num_arms_, " arms"));
    }
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_feature", kPath, true, 0, 0,
                                      std::numeric_limits<uint32_t>::max(), &num_feature));
    if (num_feature != num_features_) {
      return Invalid(absl::StrCat("the model has ", num_feature,
                                  " features (learner_model_param.num_feature), the problem "
                                  "has ",
                                  num_features_));
    }
    if (num_feature == 0) {
      return Invalid("the model has 0 features; libxgboost 1.7.4 refuses to predict with it");
    }
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_target", kPath, false, 1, 1, 1, &num_target));
    DECISION_RETURN_IF_ERROR(
        IntParam(param, "boost_from_average", kPath, false, 1, 0, 1, &boost_from_average));
    absl::string_view base_score;
    DECISION_RETURN_IF_ERROR(RequireString(param, "base_score", kPath, &base_score));
    double score = 0;
    if (!ParseFiniteFloat(base_score, &score)) {
      return Invalid(absl::StrCat(kPath, ".base_score is \"", base_score,
                                  "\", not a finite float"));
    }
    if (forest_ != nullptr) forest_->base_score = static_cast<float>(score);
    return absl::OkStatus();
  }

  // SoftmaxMultiClassObj::LoadConfig: FromJson(in["softmax_multiclass_param"]). The
  // learner overwrites num_class when it configures; a disagreement is refused anyway.
  absl::Status CheckObjective(size_t objective) const {
    constexpr absl::string_view kPath = "learner.objective";
    size_t param;
    DECISION_RETURN_IF_ERROR(
        RequireMember(objective, "softmax_multiclass_param", Kind::kObject, kPath, &param));
    const std::string path = absl::StrCat(kPath, ".softmax_multiclass_param");
    DECISION_RETURN_IF_ERROR(RequireStringMembers(param, path));
    int64_t num_class = 0;
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_class", path, true, 0, 1,
                                      std::numeric_limits<int32_t>::max(), &num_class));
    if (num_class != num_arms_) {
      return Invalid(absl::StrCat(path, ".num_class is ", num_class,
                                  " but the model has ", num_arms_, " classes"));
    }
    return absl::OkStatus();
  }

  // --- gblinear: GBLinearModel::LoadModel.

  absl::Status CheckGblinear(size_t model) const {
    constexpr absl::string_view kPath = "learner.gradient_booster.model";
    const size_t weights = Member(model, "weights");
    if (weights == kMissing) return Invalid(absl::StrCat(kPath, " has no \"weights\""));
    const uint64_t want = (static_cast<uint64_t>(num_features_) + 1) * num_arms_;
    const Value& w = doc_.values[weights];
    if (w.kind == Kind::kTypedArray) {
      if (w.elem != Elem::kF32) {
        return Invalid(absl::StrCat(kPath, ".weights is a typed array of ", ElemName(w.elem),
                                    ", not float32"));
      }
    } else {
      DECISION_RETURN_IF_ERROR(RequireKind(weights, Kind::kArray, absl::StrCat(kPath, ".weights")));
    }
    if (w.count != want) {
      return Invalid(absl::StrCat(kPath, ".weights has ", w.count,
                                  " entries, not (num_feature + 1) * num_class = ", want));
    }
    std::vector<double> values;
    DECISION_RETURN_IF_ERROR(ReadFloats(weights, absl::StrCat(kPath, ".weights"), &values));
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        return Invalid(absl::StrCat(kPath, ".weights[", i, "] is ", values[i]));
      }
    }
    const size_t rounds = Member(model, "boosted_rounds");
    if (rounds != kMissing) {
      DECISION_RETURN_IF_ERROR(
          RequireKind(rounds, Kind::kInteger, absl::StrCat(kPath, ".boosted_rounds")));
      const int64_t r = doc_.values[rounds].integer;
      if (r < 0 || r > std::numeric_limits<int32_t>::max()) {
        return Invalid(absl::StrCat(kPath, ".boosted_rounds is ", r));
      }
    }
    if (forest_ != nullptr) {
      forest_->num_class = num_arms_;
      forest_->num_features = num_features_;
      // float32 as they are; a JSON number rounded to float, as the trees' values are.
      forest_->linear_weights.assign(values.size(), 0.0f);
      for (size_t i = 0; i < values.size(); ++i) {
        forest_->linear_weights[i] = static_cast<float>(values[i]);
      }
    }
    return absl::OkStatus();
  }

  // Reads the elements of a float array already known to be a float32 typed array or a
  // generic array; generic elements must be floats (libxgboost's get<Number const>).
  absl::Status ReadFloats(size_t array, absl::string_view path,
                          std::vector<double>* out) const {
    const Value& a = doc_.values[array];
    out->resize(a.count);
    if (a.kind == Kind::kTypedArray) {
      const char* p = doc_.input.data() + a.offset;
      for (uint32_t i = 0; i < a.count; ++i) {
        const uint32_t bits = static_cast<uint32_t>(ReadBigEndian(p + 4 * i, 4));
        float f;
        std::memcpy(&f, &bits, 4);
        (*out)[i] = f;
      }
      return absl::OkStatus();
    }
    for (uint32_t i = 0; i < a.count; ++i) {
      const Value& v = doc_.values[array + 1 + i];  // scalars take one record each
      if (v.kind != Kind::kNumber) {
        return Invalid(absl::StrCat(path, "[", i, "] is ", KindName(v),
                                    "; libxgboost 1.7.4 reads only floats there (e.g. 0E0)"));
      }
      (*out)[i] = v.number;
    }
    return absl::OkStatus();
  }

  // --- gbtree: GBTreeModel::LoadModel, RegTree::LoadModel.

  absl::Status CheckGbtree(size_t model) {
    constexpr absl::string_view kPath = "learner.gradient_booster.model";
    size_t param, trees, tree_info;
    DECISION_RETURN_IF_ERROR(
        RequireMember(model, "gbtree_model_param", Kind::kObject, kPath, &param));
    const std::string param_path = absl::StrCat(kPath, ".gbtree_model_param");
    DECISION_RETURN_IF_ERROR(RequireStringMembers(param, param_path));
    int64_t num_trees = 0, num_parallel_tree = 0, size_leaf_vector = 0;
    DECISION_RETURN_IF_ERROR(
        IntParam(param, "num_trees", param_path, true, 0, 0, limits_.max_trees, &num_trees));
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_parallel_tree", param_path, false, 1, 1,
                                      limits_.max_trees, &num_parallel_tree));
    DECISION_RETURN_IF_ERROR(
        IntParam(param, "size_leaf_vector", param_path, false, 0, 0, 0, &size_leaf_vector));
    // Each boosting round adds num_class * num_parallel_tree trees; BoostedRounds()
    // divides by that product (as uint32: a product that wraps to 0 would divide by 0).
    const int64_t layer = num_parallel_tree * num_arms_;
    if (layer > std::numeric_limits<int32_t>::max()) {
      return Invalid(absl::StrCat("num_class * num_parallel_tree is ", layer,
                                  ", more than libxgboost's 32-bit tree counts hold"));
    }
    if (num_trees % layer != 0) {
      return Invalid(absl::StrCat("gbtree_model_param.num_trees is ", num_trees,
                                  ", not a multiple of num_class * num_parallel_tree = ",
                                  layer));
    }
    DECISION_RETURN_IF_ERROR(RequireMember(model, "trees", Kind::kArray, kPath, &trees));
    DECISION_RETURN_IF_ERROR(
        RequireMember(model, "tree_info", Kind::kArray, kPath, &tree_info));
    if (doc_.values[trees].count != num_trees) {
      return Invalid(absl::StrCat("gbtree_model_param.num_trees is ", num_trees,
                                  " but the trees array has ", doc_.values[trees].count,
                                  " trees"));
    }
    if (doc_.values[tree_info].count != num_trees) {
      return Invalid(absl::StrCat("gbtree_model_param.num_trees is ", num_trees,
                                  " but tree_info has ", doc_.values[tree_info].count,
                                  " entries"));
    }
    for (uint32_t i = 0; i < doc_.values[tree_info].count; ++i) {
      const Value& v = doc_.values[tree_info + 1 + i];
      if (v.kind != Kind::kInteger) {
        return Invalid(absl::StrCat("tree_info[", i, "] is ", KindName(v), ", not an integer"));
      }
      if (v.integer < 0 || v.integer >= num_arms_) {
        return Invalid(absl::StrCat("tree_info[", i, "] is ", v.integer,
                                    ", not a class in [0, ", num_arms_, ")"));
      }
    }
    if (forest_ != nullptr) {
      forest_->num_class = num_arms_;
      forest_->num_features = num_features_;
      forest_->tree_class.clear();
      for (uint32_t i = 0; i < doc_.values[tree_info].count; ++i) {
        forest_->tree_class.push_back(
            static_cast<int32_t>(doc_.values[tree_info + 1 + i].integer));
      }
    }
    size_t at = trees + 1;
    for (uint32_t t = 0; t < doc_.values[trees].count; ++t, at += doc_.Span(at)) {
      DECISION_RETURN_IF_ERROR(CheckTree(t, at));
    }
    return absl::OkStatus();
  }

  // Reads a per-node integer array. In a typed tree it must be a typed array of one of
  // `typed_elems`; else a generic array of integers (or, for default_left, of booleans
  // and integers: GetElem<Boolean>).
  absl::Status ReadInts(size_t tree, int t, const char* key, bool typed,
                        std::initializer_list<Elem> typed_elems, bool booleans_too,
                        int64_t num_nodes, std::vector<int64_t>* out) const {
    const size_t array = Member(tree, key);
    if (array == kMissing) return Invalid(absl::StrCat("tree ", t, " has no ", key));
    const Value& a = doc_.values[array];
    DECISION_RETURN_IF_ERROR(RequireArrayForm(t, key, a, typed, typed_elems));
    if (a.count != num_nodes) {
      return Invalid(absl::StrCat("tree ", t, ": ", key, " has ", a.count,
                                  " entries, tree_param.num_nodes is ", num_nodes));
    }
    out->resize(a.count);
    if (typed) {
      const size_t size = ElemSize(a.elem);
      const char* p = doc_.input.data() + a.offset;
      for (uint32_t i = 0; i < a.count; ++i) {
        const uint64_t u = ReadBigEndian(p + size * i, size);
        int64_t value = static_cast<int64_t>(u);
        if (a.elem == Elem::kI32) value = static_cast<int32_t>(static_cast<uint32_t>(u));
        (*out)[i] = value;
      }
      return absl::OkStatus();
    }
    for (uint32_t i = 0; i < a.count; ++i) {
      const Value& v = doc_.values[array + 1 + i];
      if (v.kind != Kind::kInteger && !(booleans_too && v.kind == Kind::kBool)) {
        return Invalid(absl::StrCat("tree ", t, ": ", key, "[", i, "] is ", KindName(v),
                                    ", not an integer"));
      }
      (*out)[i] = v.integer;
    }
    return absl::OkStatus();
  }

  absl::Status ReadTreeFloats(size_t tree, int t, const char* key, bool typed,
                              int64_t num_nodes, std::vector<double>* out) const {
    const size_t array = Member(tree, key);
    if (array == kMissing) return Invalid(absl::StrCat("tree ", t, " has no ", key));
    const Value& a = doc_.values[array];
    DECISION_RETURN_IF_ERROR(RequireArrayForm(t, key, a, typed, {Elem::kF32}));
    if (a.count != num_nodes) {
      return Invalid(absl::StrCat("tree ", t, ": ", key, " has ", a.count,
                                  " entries, tree_param.num_nodes is ", num_nodes));
    }
    return ReadFloats(array, absl::StrCat("tree ", t, ": ", key), out);
  }

  // RegTree::LoadModel reads a tree as typed (UBJSON typed arrays, when loss_changes is
  // one) or generic throughout; get<> of the other form fails.
  absl::Status RequireArrayForm(int t, const char* key, const Value& a, bool typed,
                                std::initializer_list<Elem> typed_elems) const {
    if (!typed) {
      if (a.kind != Kind::kArray) {
        return Invalid(absl::StrCat("tree ", t, ": ", key, " is ", KindName(a),
                                    ", not an array like loss_changes"));
      }
      return absl::OkStatus();
    }
    if (a.kind == Kind::kTypedArray) {
      for (Elem e : typed_elems) {
        if (a.elem == e) return absl::OkStatus();
      }
    }
    std::string want;
    for (Elem e : typed_elems) absl::StrAppend(&want, want.empty() ? "" : " or ", ElemName(e));
    return Invalid(absl::StrCat("tree ", t, ": ", key, " is ",
                                a.kind == Kind::kTypedArray
                                    ? absl::StrCat("a typed array of ", ElemName(a.elem))
                                    : std::string(KindName(a)),
                                ", not a typed array of ", want,
                                " (loss_changes is a typed array)"));
  }

  absl::Status CheckTree(int t, size_t tree) {
    const std::string tree_path = absl::StrCat("tree ", t);
    DECISION_RETURN_IF_ERROR(RequireKind(tree, Kind::kObject, tree_path));
    // GBTreeModel::LoadModel puts the tree at trees.at(id): two trees with one id leave a
    // null tree for prediction to dereference. Here the id must be the position.
    size_t id;
    DECISION_RETURN_IF_ERROR(RequireMember(tree, "id", Kind::kInteger, tree_path, &id));
    if (doc_.values[id].integer != t) {
      return Invalid(absl::StrCat("tree ", t, " has id ", doc_.values[id].integer,
                                  "; trees must be in the order of their ids"));
    }

    // tree_param (FromJson: string values; TreeParam's fields).
    size_t param;
    DECISION_RETURN_IF_ERROR(RequireMember(tree, "tree_param", Kind::kObject, tree_path, &param));
    const std::string param_path = absl::StrCat(tree_path, ": tree_param");
    DECISION_RETURN_IF_ERROR(RequireStringMembers(param, param_path));
    int64_t num_nodes = 0, num_deleted = 0, tree_features = 0, size_leaf_vector = 0;
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_nodes", param_path, true, 1, 1,
                                      limits_.max_nodes_per_tree, &num_nodes));
    DECISION_RETURN_IF_ERROR(
        IntParam(param, "num_deleted", param_path, false, 0, 0, num_nodes, &num_deleted));
    DECISION_RETURN_IF_ERROR(IntParam(param, "num_feature", param_path, true, 0, 0,
                                      std::numeric_limits<uint32_t>::max(), &tree_features));
    if (tree_features != num_features_) {
      return Invalid(absl::StrCat(param_path, ".num_feature is ", tree_features,
                                  " but the model has ", num_features_, " features"));
    }
    DECISION_RETURN_IF_ERROR(
        IntParam(param, "size_leaf_vector", param_path, false, 0, 0, 0, &size_leaf_vector));
    total_nodes_ += num_nodes;
    if (total_nodes_ > limits_.max_total_nodes) {
      return Invalid(absl::StrCat("the trees have more than ", limits_.max_total_nodes,
                                  " nodes in all (the limit)"));
    }

    const size_t loss_changes = Member(tree, "loss_changes");
    const size_t split_indices = Member(tree, "split_indices");
    const bool typed =
        loss_changes != kMissing && doc_.values[loss_changes].kind == Kind::kTypedArray;
    // IsA<I64Array>(in["split_indices"]) picks the index type of a typed tree.
    const bool feature_is_64 = split_indices != kMissing &&
                               doc_.values[split_indices].kind == Kind::kTypedArray &&
                               doc_.values[split_indices].elem == Elem::kI64;

    TreeArrays& a = arrays_;
    DECISION_RETURN_IF_ERROR(
        ReadTreeFloats(tree, t, "loss_changes", typed, num_nodes, &a.loss_change));
    DECISION_RETURN_IF_ERROR(
        ReadTreeFloats(tree, t, "sum_hessian", typed, num_nodes, &a.sum_hessian));
    DECISION_RETURN_IF_ERROR(
        ReadTreeFloats(tree, t, "base_weights", typed, num_nodes, &a.base_weight));
    DECISION_RETURN_IF_ERROR(
        ReadInts(tree, t, "left_children", typed, {Elem::kI32}, false, num_nodes, &a.left));
    DECISION_RETURN_IF_ERROR(
        ReadInts(tree, t, "right_children", typed, {Elem::kI32}, false, num_nodes, &a.right));
    DECISION_RETURN_IF_ERROR(
        ReadInts(tree, t, "parents", typed, {Elem::kI32}, false, num_nodes, &a.parent));
    DECISION_RETURN_IF_ERROR(ReadInts(tree, t, "split_indices", typed,
                                      {feature_is_64 ? Elem::kI64 : Elem::kI32}, false,
                                      num_nodes, &a.split_index));
    DECISION_RETURN_IF_ERROR(
        ReadTreeFloats(tree, t, "split_conditions", typed, num_nodes, &a.split_condition));
    DECISION_RETURN_IF_ERROR(ReadInts(tree, t, "default_left", typed, {Elem::kU8}, true,
                                      num_nodes, &a.default_left));
    for (int64_t i = 0; i < num_nodes; ++i) {
      if (a.default_left[i] != 0 && a.default_left[i] != 1) {
        return Invalid(absl::StrCat("tree ", t, " node ", i, " has default_left ",
                                    a.default_left[i], ", not 0 or 1"));
      }
    }
    // split_type is optional (models before 1.6 lack it). libxgboost does not check its
    // length: it reads num_nodes entries whatever there are.
    if (Member(tree, "split_type") != kMissing) {
      DECISION_RETURN_IF_ERROR(ReadInts(tree, t, "split_type", typed, {Elem::kU8}, false,
                                        num_nodes, &a.split_type));
      for (int64_t i = 0; i < num_nodes; ++i) {
        if (a.split_type[i] != 0) {
          return Invalid(absl::StrCat("tree ", t, " node ", i, " is a categorical split "
                                      "(split_type ", a.split_type[i],
                                      "); categorical splits are not accepted"));
        }
      }
      // RegTree::LoadCategoricalSplit reads these four whenever split_type is present.
      static constexpr std::pair<const char*, Elem> kCategoryArrays[] = {
          {"categories_segments", Elem::kI64},
          {"categories_sizes", Elem::kI64},
          {"categories_nodes", Elem::kI32},
          {"categories", Elem::kI32}};
      for (const auto& [key, elem] : kCategoryArrays) {
        const size_t array = Member(tree, key);
        if (array == kMissing) return Invalid(absl::StrCat("tree ", t, " has no ", key));
        DECISION_RETURN_IF_ERROR(RequireArrayForm(t, key, doc_.values[array], typed, {elem}));
        if (doc_.values[array].count != 0) {
          return Invalid(absl::StrCat("tree ", t, " has categorical split data (", key, " has ",
                                      doc_.values[array].count,
                                      " entries); categorical splits are not accepted"));
        }
      }
    }
    DECISION_RETURN_IF_ERROR(CheckTreeStructure(t, num_nodes, num_deleted));
    if (forest_ != nullptr) AddToForest(num_nodes);
    return absl::OkStatus();
  }

  // The tree just checked, appended to forest_ (core/xgboost_forest.h): children as
  // indices into forest_->nodes (the right child is the left + 1, as checked); a leaf is
  // its own left child with condition +inf, its value in leaf_values. Deleted nodes are
  // copied as leaves; no walk reaches them. The depth is the walk's (walk_depth_).
  void AddToForest(int64_t n) {
    const TreeArrays& a = arrays_;
    const uint32_t base = static_cast<uint32_t>(forest_->nodes.size());
    forest_->roots.push_back(base);
    int32_t depth = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool leaf = a.left[i] == -1;
      const uint32_t self = base + static_cast<uint32_t>(i);
      forest_->nodes.push_back(
          {leaf ? self : base + static_cast<uint32_t>(a.left[i]),
           leaf ? 0 : static_cast<int32_t>(a.split_index[i]),
           leaf ? std::numeric_limits<float>::infinity()
                : static_cast<float>(a.split_condition[i])});
      forest_->leaf_values.push_back(leaf ? static_cast<float>(a.split_condition[i]) : 0.0f);
      depth = std::max(depth, walk_depth_[i]);
    }
    forest_->depths.push_back(static_cast<uint16_t>(depth));
  }

  absl::Status CheckTreeStructure(int t, int64_t n, int64_t num_deleted) {
    const TreeArrays& a = arrays_;
    const std::pair<const char*, const std::vector<double>*> floats[] = {
        {"split_conditions", &a.split_condition},
        {"base_weights", &a.base_weight},
        {"loss_changes", &a.loss_change},
        {"sum_hessian", &a.sum_hessian}};
    for (int64_t i = 0; i < n; ++i) {
      for (const auto& [name, values] : floats) {
        if (!std::isfinite((*values)[i])) {
          const bool leaf = a.left[i] == -1;
          return Invalid(absl::StrCat(
              "tree ", t, " node ", i, " has ",
              values == &a.split_condition ? (leaf ? "leaf value" : "split condition") : name,
              " ", (*values)[i]));
        }
      }
    }
    // The root's parent: the Node constructor stores it with the left-child bit set, and
    // IsRoot() holds only if that gives -1, i.e. for 2147483647 (what 1.7.4 writes) or -1.
    if (a.parent[0] != -1 && a.parent[0] != kDeletedSplitIndex) {
      return Invalid(absl::StrCat("tree ", t, " root has parent ", a.parent[0],
                                  ", not 2147483647 (none)"));
    }

    // Walk from the root with an explicit stack, recording each node's depth and parent.
    std::vector<int32_t>& parent = walk_parent_;
    std::vector<int32_t>& depth = walk_depth_;
    parent.assign(n, -1);
    depth.assign(n, -1);
    std::vector<int32_t>& stack = walk_stack_;
    stack.clear();
    depth[0] = 0;
    stack.push_back(0);
    while (!stack.empty()) {
      const int32_t v = stack.back();
      stack.pop_back();
      const int64_t left = a.left[v];
      const int64_t right = a.right[v];
      if (left == -1) {
        if (right != -1) {
          return Invalid(absl::StrCat("tree ", t, " node ", v,
                                      " is a leaf (left child -1) with right child ", right));
        }
        // A split index word of all ones would count the leaf as deleted.
        if (a.split_index[v] < 0 || a.split_index[v] >= kDeletedSplitIndex) {
          return Invalid(absl::StrCat("tree ", t, " leaf ", v, " has split index ",
                                      a.split_index[v]));
        }
        continue;
      }
      if (left < 1 || left >= n) {
        return Invalid(absl::StrCat("tree ", t, " node ", v, " has left child ", left,
                                    ", outside [1, ", n, ")"));
      }
      if (right < 1 || right >= n) {
        return Invalid(absl::StrCat("tree ", t, " node ", v, " has right child ", right,
                                    ", outside [1, ", n, ")"));
      }
      // predict_fn.h GetNextNode: a value that is present goes to LeftChild() +
      // !(value < split_condition); right_children is used only for missing values.
      if (right != left + 1) {
        return Invalid(absl::StrCat("tree ", t, " node ", v, " has children ", left, " and ",
                                    right, "; libxgboost 1.7.4 predicts with left child + 1 "
                                    "as the right child, so it must be ", left + 1));
      }
      if (a.split_index[v] < 0 || a.split_index[v] >= num_features_) {
        return Invalid(absl::StrCat("tree ", t, " node ", v, " has split index ",
                                    a.split_index[v], ", not a feature in [0, ",
                                    num_features_, ")"));
      }
      for (const int64_t child64 : {left, right}) {
        const int32_t child = static_cast<int32_t>(child64);
        if (depth[child] >= 0) {
          for (int32_t up = v; up != -1; up = parent[up]) {
            if (up == child) {
              return Invalid(absl::StrCat("tree ", t, " has a cycle: node ", v, " has child ",
                                          child, ", which is its ancestor"));
            }
          }
          return Invalid(absl::StrCat("tree ", t, " node ", child,
                                      " is a shared child: a child of both node ",
                                      parent[child], " and node ", v));
        }
        if (depth[v] + 1 > limits_.max_tree_depth) {
          return Invalid(absl::StrCat("tree ", t, " is deeper than ", limits_.max_tree_depth,
                                      " levels (the limit): node ", child, " is at depth ",
                                      depth[v] + 1));
        }
        depth[child] = depth[v] + 1;
        parent[child] = v;
        if (a.parent[child] != v) {
          return Invalid(absl::StrCat("tree ", t, " node ", child, " has parent ",
                                      a.parent[child], " but is a child of node ", v));
        }
      }
      // Right below left: the walk visits the left subtree first.
      stack.push_back(static_cast<int32_t>(right));
      stack.push_back(static_cast<int32_t>(left));
    }
    // Nodes the walk did not reach must be what the pruner leaves behind: deleted
    // (RegTree::DeleteNode: split index word all ones), without children. RegTree::LoadModel
    // reads every node's parent, reached or not, and counts the deleted ones against
    // tree_param.num_deleted.
    int64_t deleted = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (depth[i] >= 0) continue;
      if (a.split_index[i] != kDeletedSplitIndex || a.default_left[i] != 1 ||
          a.left[i] != -1 || a.right[i] != -1) {
        return Invalid(absl::StrCat("tree ", t, " node ", i,
                                    " is not reachable from the root and not a deleted node"));
      }
      if (a.parent[i] < 0 || a.parent[i] >= n) {
        return Invalid(absl::StrCat("tree ", t, " node ", i, " has parent ", a.parent[i],
                                    ", outside [0, ", n, ")"));
      }
      ++deleted;
    }
    if (deleted != num_deleted) {
      return Invalid(absl::StrCat("tree ", t, " has ", deleted,
                                  " deleted nodes but tree_param.num_deleted is ", num_deleted));
    }
    return absl::OkStatus();
  }

  const Document& doc_;
  const int num_arms_;
  const int num_features_;
  const XgboostModelLimits& limits_;
  XgboostForest* const forest_;  // filled for a gbtree model if not null
  int64_t total_nodes_ = 0;
  // Scratch reused from tree to tree.
  TreeArrays arrays_;
  std::vector<int32_t> walk_parent_, walk_depth_, walk_stack_;
};

// The dispatch of LearnerIO::LoadModel, with the refused '{' case apart.
enum class Dispatch { kJson, kUbjson, kLegacyBinary, kInvalidBrace };

Dispatch DispatchOf(absl::string_view bytes) {
  if (bytes.empty() || bytes[0] != '{') return Dispatch::kLegacyBinary;
  for (size_t i = 1; i < bytes.size(); ++i) {
    const char c = bytes[i];
    // std::isspace and std::isalpha in the C locale; bytes >= 0x80 are neither.
    if (c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r') continue;
    if (c == '"') return Dispatch::kJson;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) return Dispatch::kUbjson;
    return Dispatch::kInvalidBrace;
  }
  return Dispatch::kInvalidBrace;
}

absl::Status ValidateLimits(const XgboostModelLimits& l) {
  if (l.max_nesting_depth < 1 || l.max_values < 1 || l.max_trees < 1 ||
      l.max_nodes_per_tree < 1 || l.max_total_nodes < 1 || l.max_tree_depth < 1) {
    return absl::InvalidArgumentError("xgboost model limits: every limit must be positive");
  }
  if (l.max_nodes_per_tree > std::numeric_limits<int32_t>::max() ||
      l.max_trees > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        "xgboost model limits: max_nodes_per_tree and max_trees must fit in int32, as "
        "libxgboost's node and tree indices do");
  }
  return absl::OkStatus();
}

}  // namespace

XgboostModelFormat DetectXgboostModelFormat(absl::string_view bytes) {
  switch (DispatchOf(bytes)) {
    case Dispatch::kUbjson: return XgboostModelFormat::kUbjson;
    case Dispatch::kLegacyBinary: return XgboostModelFormat::kLegacyBinary;
    case Dispatch::kJson:
    case Dispatch::kInvalidBrace: break;
  }
  return XgboostModelFormat::kJson;
}

absl::Status CheckXgboostModel(absl::string_view bytes, int num_arms, int num_features,
                               const XgboostModelLimits& limits, XgboostForest* forest) {
  if (forest != nullptr) *forest = XgboostForest();
  DECISION_RETURN_IF_ERROR(ValidateExpertShape(num_arms, num_features, 0.0));
  DECISION_RETURN_IF_ERROR(ValidateLimits(limits));
  // Records hold lengths and counts in 32 bits.
  if (bytes.size() >= std::numeric_limits<uint32_t>::max()) {
    return Invalid(absl::StrCat(bytes.size(), " bytes is more than this check reads (4 GiB)"));
  }
  Document doc;
  switch (DispatchOf(bytes)) {
    case Dispatch::kLegacyBinary:
      return Invalid(
          "not a loadable XGBoost model here: the bytes are not JSON or UBJSON (they do not "
          "start with '{'); the legacy binary format is checked after conversion; see "
          "ConvertXgboostModelToUbjson");
    case Dispatch::kInvalidBrace:
      return Invalid(
          "the bytes start with '{' but are neither JSON (next '\"') nor UBJSON (next a "
          "letter); libxgboost 1.7.4 refuses them as \"Invalid model format\"");
    case Dispatch::kJson: {
      JsonParser parser(bytes, limits, &doc);
      DECISION_RETURN_IF_ERROR(parser.Parse());
      break;
    }
    case Dispatch::kUbjson: {
      UbjsonParser parser(bytes, limits, &doc);
      DECISION_RETURN_IF_ERROR(parser.Parse());
      break;
    }
  }
  DECISION_RETURN_IF_ERROR(CheckNoDuplicateKeys(doc));
  absl::Status status = ModelChecker(doc, num_arms, num_features, limits, forest).Check();
  if (!status.ok() && forest != nullptr) *forest = XgboostForest();
  return status;
}

}  // namespace decision
