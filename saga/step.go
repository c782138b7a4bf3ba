package saga

// Step is one forward action of a saga and its compensation. The runner (its
// own issue) gives it Do, Compensate, retry policies and a timeout.
type Step struct {
	Name string
}

func (s Step) validate() error { return nil }
