// Package grouptest holds the tests of the step runner's group commit
// (RunnerConfig.GroupCommit): batch-mates of a failing step or of a lost
// lease commit, and a runner killed with SIGKILL in the middle of a group
// loses and doubles nothing. A package of its own because the kill test
// runs the runner in a child process of the test binary.
package grouptest
