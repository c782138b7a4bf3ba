package pgjournal

// SQLClaim is the claim statement, for tests that look at its plan.
const SQLClaim = sqlClaim

// SQLClaimPlan is what the claim's transaction runs before it.
const SQLClaimPlan = sqlClaimPlan

// SQLLockByIDs is the group's locking read, for tests that look at its plan.
const SQLLockByIDs = sqlLockByIDs
