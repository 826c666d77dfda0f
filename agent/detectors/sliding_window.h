// The detectors' sliding windows: recent durations or samples in a deque, newest at the back, the
// oldest dropped once the window is full.
#ifndef LIFELINE_AGENT_DETECTORS_SLIDING_WINDOW_H_
#define LIFELINE_AGENT_DETECTORS_SLIDING_WINDOW_H_

#include <algorithm>
#include <cstddef>
#include <deque>
#include <utility>

namespace lifeline::agent::detail {

// Appends `value` to `window` and drops the oldest entries beyond `capacity`. A window keeps at
// least its newest entry: a capacity of 0 (a window size configured as 0) counts as 1.
template <typename T>
void PushToWindow(std::deque<T>* window, typename std::deque<T>::value_type value, size_t capacity) {
  window->push_back(std::move(value));
  while (window->size() > std::max<size_t>(capacity, 1)) window->pop_front();
}

}  // namespace lifeline::agent::detail

#endif  // LIFELINE_AGENT_DETECTORS_SLIDING_WINDOW_H_
