// GoogleTest checks shared by the checkpoint tests (the writer program links no GoogleTest, so
// they stay out of checkpoint_test_data.hpp).
#pragma once

#include <gtest/gtest.h>

#include "io/checkpoint_file.hpp"

namespace moe::checkpoint_test {

// Every header field read back equals the one written.
inline void expect_same_header(const CheckpointHeader& got, const CheckpointHeader& want) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.global_batch, want.global_batch);
  EXPECT_EQ(got.world_size, want.world_size);
  EXPECT_EQ(got.ep_size, want.ep_size);
  EXPECT_EQ(got.seed, want.seed);
  EXPECT_EQ(got.model, want.model);
  EXPECT_EQ(got.config_text, want.config_text);
  EXPECT_EQ(got.program_version, want.program_version);
  EXPECT_EQ(got.created, want.created);
  EXPECT_EQ(got.stats_path, want.stats_path);
  EXPECT_EQ(got.data_description, want.data_description);
  EXPECT_EQ(got.data_checksum, want.data_checksum);
  EXPECT_EQ(got.run_id, want.run_id);
  EXPECT_EQ(got.run_started, want.run_started);
  EXPECT_EQ(got.lineage, want.lineage);
}

}  // namespace moe::checkpoint_test
