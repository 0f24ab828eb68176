#include "common/clock.h"

namespace strata {

Clock* RealClock() {
  static SystemClock* clock = new SystemClock();
  return clock;
}

}  // namespace strata
