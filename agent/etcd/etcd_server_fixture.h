// Test support: a GoogleTest fixture holding a private etcd (EtcdTestServer) and a client of it,
// for the tests of the etcd client and of the mirror.
#ifndef LIFELINE_AGENT_ETCD_ETCD_SERVER_FIXTURE_H_
#define LIFELINE_AGENT_ETCD_ETCD_SERVER_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>

#include "agent/etcd/etcd_client.h"
#include "agent/etcd/etcd_test_server.h"

namespace lifeline::agent::testing {

class EtcdServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.ok()) << server_.error();
    auto c = EtcdClient::Create(server_.endpoint(), 2.0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }
  EtcdTestServer server_;
  std::unique_ptr<EtcdClient> client_;
};

}  // namespace lifeline::agent::testing

#endif  // LIFELINE_AGENT_ETCD_ETCD_SERVER_FIXTURE_H_
