"""Reports: rendering (text and HTML) and a loop's clock."""
