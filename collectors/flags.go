package collectors

import "fmt"

// Positive, NotNegative, AtLeast and NotEmpty check one flag's value for a collector's
// validate, which joins what they return (errors.Join): every bad value is told at once, each
// naming its flag. They return nil for a good value.

// Positive requires v > 0.
func Positive[T ~int | ~int64](flag string, v T) error {
	if v > 0 {
		return nil
	}
	return fmt.Errorf("--%s must be positive", flag)
}

// NotNegative requires v >= 0.
func NotNegative[T ~int | ~int64](flag string, v T) error {
	if v >= 0 {
		return nil
	}
	return fmt.Errorf("--%s must not be negative", flag)
}

// AtLeast requires v >= least.
func AtLeast[T ~int | ~int64](flag string, v, least T) error {
	if v >= least {
		return nil
	}
	return fmt.Errorf("--%s must be at least %v", flag, least)
}

// NotEmpty requires a value.
func NotEmpty(flag, v string) error {
	if v != "" {
		return nil
	}
	return fmt.Errorf("--%s must not be empty", flag)
}
