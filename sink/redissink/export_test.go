package redissink

// Classify is how Deliver classifies a failed add.
func (s *Sink) Classify(err error) error { return s.classify(err) }
