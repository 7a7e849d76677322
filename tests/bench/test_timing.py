from bench.timing import best_seconds


def test_best_seconds_calls_fn_calls_times_repeats_and_returns_a_per_call_time():
    num_calls = []
    seconds = best_seconds(lambda: num_calls.append(1), calls=4, repeats=3)
    assert len(num_calls) == 12
    assert 0 <= seconds < float("inf")
