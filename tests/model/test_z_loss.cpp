// The router z-loss (model/z_loss.hpp): a hand value, the loss as a sum along the sequence tree
// (sequences added in pairs, so the sum is that of halves added), its gradient against central
// differences in double (accumulated into a prior gradient), in float within rounding of double,
// and a row of very large logits that stays finite.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fd_check.hpp"
#include "model/rng.hpp"
#include "model/z_loss.hpp"

namespace moe {
namespace {

TEST(ZLoss, HandValue) {
  // Row 0: log(e^0 + e^{ln 3}) = ln 4; row 1: log(2·e^1) = 1 + ln 2. One sequence of two rows.
  const std::vector<double> logits = {0.0, std::log(3.0), 1.0, 1.0};
  const double z0 = std::log(4.0), z1 = 1.0 + std::log(2.0);
  EXPECT_NEAR(router_z_loss_forward(logits.data(), 1, 2, 2, 0.5), 0.5 * (z0 * z0 + z1 * z1), 1e-15);
  // ∂/∂l[t,e] = weight·2·z_t·softmax: row 0's softmax is (1/4, 3/4), row 1's (1/2, 1/2).
  std::vector<double> d(4, 1.0);
  router_z_loss_backward(d.data(), logits.data(), 2, 2, 0.5);
  const std::vector<double> want = {1.0 + z0 * 0.25, 1.0 + z0 * 0.75, 1.0 + z1 * 0.5,
                                    1.0 + z1 * 0.5};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(d[i], want[i], 1e-15) << i;
}

TEST(ZLoss, SequencesAreAddedAlongTheTree) {
  const int B = 4, S = 3, E = 5;
  const fd_check::Vec logits = fd_check::normal_vector("z_loss_tree", B * S * E, 3, 2.0);
  const double whole = router_z_loss_forward(logits.data(), B, S, E, 0.1);
  const double first = router_z_loss_forward(logits.data(), B / 2, S, E, 0.1);
  const double second = router_z_loss_forward(logits.data() + B / 2 * S * E, B / 2, S, E, 0.1);
  EXPECT_EQ(whole, first + second);  // bitwise: the tree's root adds the two halves
  EXPECT_EQ(router_z_loss_forward(logits.data(), B, S, E, 0.0), 0.0);
}

TEST(ZLoss, GradientMatchesFiniteDifferences) {
  const int B = 2, S = 3, E = 6, N = B * S;
  fd_check::Vec logits = fd_check::normal_vector("z_loss_logits", N * E, 5, 3.0);
  const fd_check::Vec prior = fd_check::normal_vector("z_loss_prior", N * E, 6, 1.0);
  fd_check::Vec grad = prior;
  router_z_loss_backward(grad.data(), logits.data(), N, E, 0.7);
  const fd_check::Vec numeric = fd_check::numeric_grad(
      logits, [&] { return router_z_loss_forward(logits.data(), B, S, E, 0.7); });
  fd_check::expect_grad_near(grad, prior, numeric, "d_logits");
}

TEST(ZLoss, FloatIsDoubleRounded) {
  const int N = 8, E = 16;
  const fd_check::Vec logits = fd_check::normal_vector("z_loss_float", N * E, 7, 4.0);
  const std::vector<float> logits_f(logits.begin(), logits.end());
  std::vector<double> logits_back(logits_f.begin(), logits_f.end());
  std::vector<double> d(N * E, 0.0);
  std::vector<float> d_f(N * E, 0.0f);
  router_z_loss_backward(d.data(), logits_back.data(), N, E, 0.01);
  router_z_loss_backward(d_f.data(), logits_f.data(), N, E, 0.01);
  for (int i = 0; i < N * E; ++i) EXPECT_EQ(d_f[i], static_cast<float>(d[i])) << i;
  EXPECT_EQ(router_z_loss_forward(logits_f.data(), 2, 4, E, 0.01),
            router_z_loss_forward(logits_back.data(), 2, 4, E, 0.01));
}

TEST(ZLoss, LargeLogitsStayFinite) {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f, 1000.0f};
  const double z = router_z_loss_forward(logits.data(), 1, 1, 4, 1.0);
  const double lse = 1000.0 + std::log(2.0 + std::exp(-1.0));
  EXPECT_NEAR(z, lse * lse, 1e-9 * lse * lse);
  std::vector<float> d(4, 0.0f);
  router_z_loss_backward(d.data(), logits.data(), 1, 4, 1.0);
  for (float v : d) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(d[2], 0.0f);  // softmax of −1000 next to 1000 underflows to 0
}

}  // namespace
}  // namespace moe
