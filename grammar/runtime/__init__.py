"""What runs beside a request's matcher: the closing search and its hints, early closing, the
runaway guard, jump-forward's tokenization, the fill budget and low CPU priority. Library-free."""
