// A failure as the ranks of a job report it. The first one on a host is
// published to the local ranks through the host segment; it travels to the
// other hosts as a notice on the control connections. Carrying the rank that
// saw it first (instead of a formatted message) keeps "reported by" single
// however far the failure travels.
#pragma once

#include <string>
#include <vector>

#include "shoal/core.h"

namespace shoal {

struct Failure {
  Error::Kind kind = Error::Kind::System;
  std::vector<int> ranks;  // the ranks at fault, as in Error::ranks()
  std::string message;
  int origin = -1;  // the global rank that saw it first

  static Failure of(const Error& e, int origin) { return {e.kind(), e.ranks(), e.what(), origin}; }

  // What rank `self` reports: the message, and who saw it unless that is itself.
  Error error(int self) const {
    if (origin == self) return Error(kind, message, ranks);
    return Error(kind, message + " (reported by rank " + std::to_string(origin) + ")", ranks);
  }
};

}  // namespace shoal
