// Small helpers for absl::Status propagation. Debian 12's Abseil (20220623) has no
// ABSL_RETURN_IF_ERROR / ASSIGN_OR_RETURN, so the project keeps its own two macros.
#ifndef DECISION_CORE_STATUS_MACROS_H_
#define DECISION_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status from the enclosing function if `expr` is not OK.
#define DECISION_RETURN_IF_ERROR(expr)                 \
  do {                                                 \
    ::absl::Status decision_status_ = (expr);          \
    if (!decision_status_.ok()) return decision_status_; \
  } while (0)

#define DECISION_CONCAT_INNER_(a, b) a##b
#define DECISION_CONCAT_(a, b) DECISION_CONCAT_INNER_(a, b)

// `lhs = value of statusor_expr`, or returns its status if it is not OK.
#define DECISION_ASSIGN_OR_RETURN(lhs, statusor_expr) \
  DECISION_ASSIGN_OR_RETURN_IMPL_(DECISION_CONCAT_(decision_or_, __LINE__), lhs, statusor_expr)
#define DECISION_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, statusor_expr) \
  auto tmp = (statusor_expr);                                    \
  if (!tmp.ok()) return tmp.status();                            \
  lhs = std::move(tmp).value()

#endif  // DECISION_CORE_STATUS_MACROS_H_
