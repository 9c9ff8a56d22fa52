// The job secret (common/job_secret.h) and the handshake's messages
// (common/handshake.h): where the secret comes from and what is refused, and the
// proofs each side accepts. The entry points that run the handshake over real
// sockets are tested in tests/runtime/store_auth_test.cc and
// tests/transport/auth_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/handshake.h"
#include "common/job_secret.h"

namespace rdmaflow::auth {
namespace {

// A private scratch directory for the host secret and secret files.
struct ScratchEnv {
  std::string dir;
  ScratchEnv() {
    char tmpl[] = "/tmp/rdmaflow-auth-test-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::unsetenv("RDMAFLOW_AUTH");
    ::unsetenv("RDMAFLOW_JOB_SECRET");
    ::unsetenv("RDMAFLOW_JOB_SECRET_FILE");
    ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  }
  ~ScratchEnv() { std::system(("rm -rf " + dir).c_str()); }
  std::string file(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
};

JobSecret secret_of(const std::string& text) {
  return JobSecret{SecretSource::kEnv, std::vector<uint8_t>(text.begin(), text.end()), "test"};
}

TEST(JobSecret, ComesFromTheEnvironmentAFileOrThePerUserHostSecret) {
  ScratchEnv env;
  // Nothing set: the host secret, created once, private, the same on every load.
  auto a = load_job_secret();
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->source, SecretSource::kHostDefault);
  EXPECT_EQ(a->key.size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat(a->origin.c_str(), &st), 0) << a->origin;
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto b = load_job_secret();
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(a->key, b->key);

  const std::string path = env.file("secret", "0123456789abcdef-shared\n", 0600);
  ::setenv("RDMAFLOW_JOB_SECRET_FILE", path.c_str(), 1);
  auto f = load_job_secret();
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->source, SecretSource::kFile);
  EXPECT_EQ(std::string(f->key.begin(), f->key.end()), "0123456789abcdef-shared");

  ::setenv("RDMAFLOW_JOB_SECRET", "fedcba9876543210-env", 1);  // wins over the file
  auto e = load_job_secret();
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->source, SecretSource::kEnv);

  ::setenv("RDMAFLOW_AUTH", "0", 1);  // the explicit opt-out wins over everything
  auto off = load_job_secret();
  ASSERT_TRUE(off.is_ok());
  EXPECT_EQ(off->source, SecretSource::kDisabled);
}

TEST(JobSecret, WeakOrExposedSecretsAreRefusedSayingWhy) {
  ScratchEnv env;
  ::setenv("RDMAFLOW_JOB_SECRET", "short", 1);
  auto s = load_job_secret();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().reason().find("RDMAFLOW_JOB_SECRET has 5 bytes"), std::string::npos)
      << s.status().to_string();
  ::unsetenv("RDMAFLOW_JOB_SECRET");

  const std::string open = env.file("open", "0123456789abcdef-readable", 0644);
  ::setenv("RDMAFLOW_JOB_SECRET_FILE", open.c_str(), 1);
  auto o = load_job_secret();
  ASSERT_FALSE(o.is_ok());
  EXPECT_NE(o.status().reason().find("chmod 600"), std::string::npos) << o.status().to_string();

  ::setenv("RDMAFLOW_JOB_SECRET_FILE", (env.dir + "/missing").c_str(), 1);
  EXPECT_FALSE(load_job_secret().is_ok());
  ::unsetenv("RDMAFLOW_JOB_SECRET_FILE");

  ::setenv("RDMAFLOW_AUTH", "maybe", 1);
  EXPECT_FALSE(load_job_secret().is_ok());
}

// Runs one handshake between a connector and an acceptor holding these secrets.
Status handshake(const JobSecret& c_secret, const JobSecret& a_secret, bool* acceptor_ok,
                 const char* c_label = "tcp", const char* a_label = "tcp") {
  Connector c(c_secret, c_label);
  Acceptor a(a_secret, a_label);
  auto hello = c.hello();
  if (!hello.is_ok()) return hello.status();
  auto challenge = a.challenge(*hello, "connector");
  *acceptor_ok = challenge.is_ok();
  if (!challenge.is_ok()) return challenge.status();
  auto proof = c.answer(*challenge, "acceptor");
  if (!proof.is_ok()) return proof.status();
  Status v = a.verify(*proof, "connector");
  *acceptor_ok = v.is_ok();
  return v;
}

TEST(Handshake, OnlyTheSameSecretAndLabelPass) {
  const auto good = secret_of("the-job-secret-0123456789");
  bool acceptor_ok = false;
  Status ok = handshake(good, good, &acceptor_ok);
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  EXPECT_TRUE(acceptor_ok);

  Status wrong = handshake(secret_of("another-secret-0123456789"), good, &acceptor_ok);
  EXPECT_EQ(wrong.code(), Code::kUnauthenticated);
  EXPECT_NE(wrong.reason().find("did not prove the job secret"), std::string::npos)
      << wrong.to_string();

  JobSecret host = secret_of("host-secret-0123456789");
  host.source = SecretSource::kHostDefault;
  Status hint = handshake(host, good, &acceptor_ok);
  EXPECT_NE(hint.reason().find("RDMAFLOW_JOB_SECRET_FILE"), std::string::npos) << hint.to_string();

  Status label = handshake(good, good, &acceptor_ok, "store", "tcp");
  EXPECT_FALSE(acceptor_ok);
  EXPECT_NE(label.reason().find("'store' protocol"), std::string::npos) << label.to_string();
}

TEST(Handshake, AProofIsBoundToItsRoleAndNonces) {
  const auto good = secret_of("the-job-secret-0123456789");
  // Reflection: the acceptor's own proof, sent back as the connector's, fails.
  Connector c(good, "tcp");
  Acceptor a(good, "tcp");
  auto hello = c.hello();
  ASSERT_TRUE(hello.is_ok());
  auto challenge = a.challenge(*hello, "connector");
  ASSERT_TRUE(challenge.is_ok());
  Proof reflected{};
  std::copy(challenge->end() - kMacBytes, challenge->end(), reflected.begin());
  EXPECT_FALSE(a.verify(reflected, "connector").is_ok());
  // Replay: a proof that passed once fails against a fresh challenge.
  auto proof = c.answer(*challenge, "acceptor");
  ASSERT_TRUE(proof.is_ok());
  ASSERT_TRUE(a.verify(*proof, "connector").is_ok());
  Acceptor again(good, "tcp");
  ASSERT_TRUE(again.challenge(*hello, "connector").is_ok());
  EXPECT_FALSE(again.verify(*proof, "connector").is_ok());
  // Garbage instead of a hello or a challenge is refused, never trusted.
  Hello junk;
  junk.fill(0x7f);
  EXPECT_FALSE(Acceptor(good, "tcp").challenge(junk, "stray").is_ok());
  Challenge junk2;
  junk2.fill(0);
  EXPECT_FALSE(c.answer(junk2, "impostor").is_ok());
}

}  // namespace
}  // namespace rdmaflow::auth
