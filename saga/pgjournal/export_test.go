package pgjournal

// SQLClaim is the claim statement, for tests that look at its plan.
const SQLClaim = sqlClaim
