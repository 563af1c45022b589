// The check the data-reader tests share: an open that must fail with a DataError naming the file.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "io/token_data.hpp"

namespace moe::testing_util {

// `open` must throw a DataError whose message names `path` and contains `keyword`.
inline void expect_data_error(const std::function<void()>& open, const std::string& path,
                              const std::string& keyword) {
  try {
    open();
    ADD_FAILURE() << "no DataError for " << path << " (expected '" << keyword << "')";
  } catch (const DataError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(keyword), std::string::npos) << message;
  }
}

}  // namespace moe::testing_util
