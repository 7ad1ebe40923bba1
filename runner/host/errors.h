// A problem the user can fix: main() prints it as one line and exits non-zero.
#pragma once

#include <stdexcept>

namespace dflash {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace dflash
