"""What a job did and how it is doing: checkpoint history, health, status, reports."""
